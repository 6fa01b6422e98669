"""Prompt-parameter co-evolution with scripted reflectors: the gate, untrusted replies, the schedule inside
the ES loop, and resume restoring the prompt version."""

import json

import pytest

from esopt.es import read_history
from esopt.prompt.skills import distill, feedback_lessons, gate, parse_skills, transcript
from esopt.rollout import Trajectory, Turn
from esopt.train.coevolution import PromptEvolution
from esopt.train.config import load_config
from esopt.train.es import train


class Scripted:
    """A reflector that answers every call with fixed text (or None: a failed endpoint)."""

    def __init__(self, reply):
        self.reply, self.calls = reply, 0

    def complete(self, messages):
        self.calls += 1
        return self.reply


def episode(success: bool) -> Trajectory:
    t = Trajectory(task_seed=1)
    t.add(Turn(prompt="obs", prompt_ids=[1], token_ids=[2], text="set 1 1 1", logprobs=None,
               reward=float(success), terminated=True, truncated=False,
               info={"is_success": success, "action_is_valid": True, "feedback": "ok"}))
    return t


def test_gate_accepts_only_a_better_prompt():
    # binary fractions, so "current + margin" is exact and the boundary case is what it says
    score = {"current": 0.5, "better": 0.875, "at_margin": 0.75, "inside_margin": 0.625, "worse": 0.25}.get
    assert gate(score, "current", "better", margin=0.25) == (True, 0.5, 0.875)
    assert gate(score, "current", "inside_margin", margin=0.25) == (False, 0.5, 0.625)  # better, not by the margin
    assert gate(score, "current", "at_margin", margin=0.25)[0] is False  # by exactly the margin: not more
    assert gate(score, "current", "inside_margin", margin=0.0)[0] is True
    assert gate(score, "current", "worse", margin=0.0) == (False, 0.5, 0.25)
    assert gate(score, "current", "current", margin=0.0)[0] is False  # a tie keeps the current prompt


class SkillfulSudoku:
    """A scripted policy for 4x4 Sudoku with one hole: it fills the hole correctly only when its system prompt
    holds the skill "fill the hole", and otherwise replies prose (an invalid move)."""

    model = tokenizer = None

    def __init__(self):
        self.turns = 0

    def build_prompt(self, messages):
        return "\n".join(f"[{m['role']}] {m['content']}" for m in messages)

    def generate(self, prompts, sampling, seed=None, return_logprobs=False):
        from esopt.engines.base import Completion

        self.turns += len(prompts)
        return [Completion([1], [2], self.act(p)) for p in prompts]

    @staticmethod
    def act(prompt: str) -> str:
        if "- fill the hole" not in prompt.split("[user]")[0]:
            return "I am not sure"
        board = prompt.rsplit("[user] ", 1)[1].splitlines()[:4]
        r = next(i for i, row in enumerate(board) if "." in row)
        cells = board[r].split()[1]
        return f"set {r + 1} {cells.index('.') + 1} {({'1', '2', '3', '4'} - set(cells)).pop()}"


def test_the_gate_score_is_the_policys_success_with_that_system_prompt(tmp_path, monkeypatch):
    """The real `prompt_score` (the other tests script it): the unperturbed policy's mean score on
    `gate_tasks` tasks under the given system prompt; by hand 1.0 with the skill, 0.0 without."""
    from esopt.train.evaluate import rollout_spec
    from esopt.train.rundir import RunDir
    from esopt.train.tasks import env_factory

    config = load_config("smoke", ["env.kwargs.h_star=1", "env.few_shot=0", "prompt.every=1", "prompt.gate_tasks=5",
                                   "es.reward=success"])
    make = env_factory(config)
    policy = SkillfulSudoku()
    evolution = PromptEvolution(policy, config, RunDir(tmp_path), make, rollout_spec(config, make), 0, False)
    system = evolution.program.render()
    # without the skill: 5 tasks x 3 invalid turns (the turn cap is 3 H*); with it: 5 one-move successes
    assert evolution.prompt_score(system, 1) == 0.0 and policy.turns == 15
    assert evolution.prompt_score(system + "\n\nSkills:\n- fill the hole", 1) == 1.0 and policy.turns == 20
    shaped = config.model_copy(update={"es": config.es.model_copy(update={"reward": "shaped"})})
    evolution.config = shaped  # the gate scores with the run's reward: an invalid first move shapes to 0
    assert evolution.prompt_score(system, 1) == 0.0
    # the gate's tasks are its own: not the training tasks the skills were distilled from (generation 0's
    # trajectories feed the prompt step after it, numbered 1), nor those of the generation that follows
    from esopt.rollout import RolloutSpec
    from esopt.train.es import generation_tasks

    seen, run = [], RolloutSpec.run
    monkeypatch.setattr(RolloutSpec, "run", lambda self, policy, make, tasks, seed, **kw: (
        seen.append(list(tasks)), run(self, policy, make, tasks, seed, **kw))[1])
    evolution.prompt_score(system, 1)
    assert len(seen) == 1 and len(set(seen[0])) == 5
    assert not set(seen[0]) & (set(generation_tasks(config, 0)) | set(generation_tasks(config, 1)))


def test_untrusted_replies_are_parsed_or_dropped():
    text = "Sure! Here:\n- Pick a listed empty cell\n* pick a listed EMPTY cell\n2) Check the row\nrandom prose\n-\n"
    assert parse_skills(text, 8) == ["Pick a listed empty cell", "Check the row"]
    assert parse_skills(None, 8) == [] and parse_skills("\x00\x01", 3) == []
    assert len(parse_skills("\n".join(f"- s{i}" for i in range(20)), 5)) == 5


def test_distill_merges_lessons_and_keeps_the_prompt_on_bad_replies():
    logs = []
    good = Scripted("- Write one move\n- Use an empty cell")
    assert distill(good, "Sudoku", [episode(False), episode(True)], [0.0, 1.0], ["old"], 4, log=logs.append) == [
        "Write one move", "Use an empty cell"]
    assert good.calls == 2  # one analysis batch + one merge
    assert distill(Scripted(None), "Sudoku", [episode(False)], [0.0], [], 4, log=logs.append) is None
    assert distill(Scripted("no bullets at all"), "Sudoku", [episode(False)], [0.0], [], 4, log=logs.append) is None
    assert len(logs) == 2 and all("current prompt stays" in m for m in logs)


def failed_turns(*pairs) -> Trajectory:
    t = Trajectory(task_seed=2)
    for action, feedback in pairs:
        t.add(Turn(prompt="<|im_start|>user\nboard<|im_end|>", prompt_ids=[1], token_ids=[2], text=action,
                   logprobs=None, reward=0.0, terminated=False, truncated=False,
                   info={"is_success": False, "action_is_valid": "invalid" not in feedback,
                         "action_is_correct": False, "feedback": feedback}, observation="board 1.34"))
    return t


def test_feedback_lessons_rank_mistakes_by_frequency_and_merge_with_current():
    episodes = [failed_turns(("set 1 3 24", "invalid: value 24 out of range 1..4"),
                             ("set 2 2 3", "invalid: cell r2c2 is already filled")),
                failed_turns(("set 1 1 9", "invalid: value 9 out of range 1..4")),
                episode(True)]  # a success teaches nothing here
    lessons = feedback_lessons(episodes, ["Avoid moves like 'set 4 4 7': they got 'invalid: value 7 out of range "
                                          "1..4'", "Check the row"], max_skills=8)
    # the out-of-range mistake happened twice (numbers masked), so it ranks first; the older lesson about the
    # same mistake is replaced, an unrelated one is kept
    assert lessons == ["Avoid moves like 'set 1 3 24': they got 'invalid: value 24 out of range 1..4'",
                       "Avoid moves like 'set 2 2 3': they got 'invalid: cell r2c2 is already filled'",
                       "Check the row"]
    assert feedback_lessons(episodes, [], max_skills=1) == lessons[:1]
    assert feedback_lessons([episode(True), episode(False)], ["keep"], 4) is None  # no failing turn with feedback


def test_feedback_lessons_skip_feedback_that_passing_turns_get_too():
    def turn_of(action: str, feedback: str, correct: bool) -> Turn:
        return Turn(prompt="p", prompt_ids=[1], token_ids=[2], text=action, logprobs=None, reward=0.0,
                    terminated=True, truncated=False, observation="page",
                    info={"is_success": correct, "action_is_valid": True, "action_is_correct": correct,
                          "feedback": feedback})
    solved, unsolved = Trajectory(task_seed=1), Trajectory(task_seed=2)
    solved.add(turn_of('click("4")', "ok", True))
    unsolved.add(turn_of('click("7")', "ok", False))  # a valid move that ended an unsolved episode: "ok" too
    assert feedback_lessons([solved, unsolved], ["keep"], 4) is None
    unsolved.add(turn_of('click("9",\n  "x")', "click: button must be one of left, middle, right", False))
    assert feedback_lessons([solved, unsolved], [], 4) == [
        "Avoid moves like 'click(\"9\", \"x\")': they got 'click: button must be one of left, middle, right'"]


def test_transcript_shows_the_observation_not_the_chat_template():
    text = transcript(failed_turns(("set 1 3 24", "invalid: value 24 out of range 1..4")), 0.0)
    assert "board 1.34" in text and "im_start" not in text and "'set 1 3 24'" in text


@pytest.mark.slow
def test_schedule_ledger_versions_and_resume(tmp_path, monkeypatch):
    reflector = Scripted("- Pick a cell listed as empty\n- Answer with one move")
    monkeypatch.setattr(PromptEvolution, "_reflector", lambda self: reflector)
    # a scripted gate score: longer prompts (more skills) score higher, so the candidate wins
    monkeypatch.setattr(PromptEvolution, "prompt_score", lambda self, text, generation: float(len(text)))
    overrides = ["steps=4", "eval.tasks=2", "eval.every=0", "measure_inference_peak=false", "prompt.every=2",
                 "checkpoint_every=1"]
    out = tmp_path / "run"
    train(load_config("smoke", overrides[:1] + ["steps=2"] + overrides[1:]), out, progress=False)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
    assert [r["step"] for r in rows if "prompt_accepted" in r] == [2]  # a prompt step after generation 2 only
    assert [r["prompt_version"] for r in rows] == [0, 0]
    assert json.loads((out / "final" / "prompt.json").read_text())["version"] == 1
    assert "Pick a cell listed as empty" in json.loads((out / "prompts" / "v0001.json").read_text())["skills"]

    # resume to 4 generations: generations 3-4 run with version 1, a second prompt step follows generation 4
    config = load_config(out / "config.yaml", ["steps=4"])
    train(config, out, resume=True, progress=False)
    assert [r.get("prompt_version") for r in read_history(out / "history.jsonl")] == [0, 0, 1, 1]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"train"' in x]
    assert [r["step"] for r in rows if "prompt_accepted" in r] == [2, 4]


def test_http_reflector_needs_a_url_and_ray_does_not_take_prompts():
    from esopt.train.config import ConfigError, build_config

    with pytest.raises(ConfigError, match="base_url"):
        build_config({}, ["prompt.every=1", "prompt.reflector=http"])
    with pytest.raises(ConfigError, match="Ray workers"):
        build_config({}, ["prompt.every=1", "distributed.backend=ray"])


def test_feedback_reflector_proposes_lessons_from_the_runs_own_failures(tmp_path, monkeypatch):
    monkeypatch.setattr(PromptEvolution, "prompt_score", lambda self, text, generation: float(len(text)))
    monkeypatch.setattr(PromptEvolution, "_reflector", lambda self: pytest.fail("the feedback reflector asks no model"))
    out = tmp_path / "run"
    train(load_config("smoke", ["steps=1", "eval.tasks=2", "eval.every=0", "measure_inference_peak=false",
                                "prompt.every=1", "prompt.reflector=feedback", "prompt.max_skills=3"]),
          out, progress=False)
    skills = json.loads((out / "prompts" / "v0001.json").read_text())["skills"]
    assert 1 <= len(skills) <= 3 and all(s.startswith("Avoid moves like '") for s in skills)
    assert json.loads((out / "final" / "prompt.json").read_text())["version"] == 1  # longer prompt wins this gate


def test_gain_judges_each_half_of_a_coevolution_run_alone(tmp_path, monkeypatch):
    from esopt.experiments import gain

    monkeypatch.setattr(PromptEvolution, "prompt_score", lambda self, text, generation: float(len(text)))
    run = tmp_path / "run"
    train(load_config("smoke", ["steps=1", "eval.tasks=2", "eval.every=0", "measure_inference_peak=false",
                                "prompt.every=1", "prompt.reflector=feedback", "prompt.max_skills=2"]),
          run, progress=False)
    final = json.loads((run / "final" / "prompt.json").read_text())["system"]
    assert gain.coevolved_prompt(run) == final
    seen = {}
    real = gain._evaluate_cached

    def spy(cache, key, policy, config, make, progress):
        seen[key] = config.env.system_prompt
        return real(cache, key, policy, config, make, progress)

    monkeypatch.setattr(gain, "_evaluate_cached", spy)
    argv = ["--runs", str(run), "--episodes", "2", "--temperatures", "--no-controls", "--quiet",
            "--out", str(tmp_path / "gain")]
    assert gain.main(argv) == 0
    result = json.loads((tmp_path / "gain" / "gain.json").read_text())
    assert seen["es-run-test"] == final and seen["prompt-run-test"] == final
    assert seen["weights-run-test"] == seen["base-test"] != final  # the starting prompt
    norms = result["norms"]
    assert norms["prompt-run"] == 0.0 and norms["weights-run"] == norms["es-run"] > 0
    assert gain.main([*argv, "--no-parts", "--out", str(tmp_path / "plain")]) == 0
    assert set(json.loads((tmp_path / "plain" / "gain.json").read_text())["evals"]) == {"base", "es-run"}

    # a run whose every candidate lost its gate is a parameters-only run: no halves to judge
    (run / "final" / "prompt.json").write_text((run / "prompts" / "v0000.json").read_text())
    assert gain.coevolved_prompt(run) is None
