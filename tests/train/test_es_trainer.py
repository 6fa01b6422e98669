"""`esopt.ESTrainer`: TRL's GRPOTrainer calling convention (reward functions, datasets, config names) over the ES
run dir (ledger replay, resume, checkpoints loadable in transformers)."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from esopt import ESConfig, ESTrainer
from esopt.envs.dataset import PromptDatasetEnv, score_completion
from esopt.es import read_history, replay
from esopt.models import load_policy
from esopt.train.config import ConfigError

datasets = pytest.importorskip("datasets")


def sums(n: int = 12, conversational: bool = False):
    rows = []
    for i in range(n):
        a, b = i % 4, i // 4
        text = f"{a}+{b}="
        rows.append({"prompt": [{"role": "user", "content": text}] if conversational else text,
                     "answer": str(a + b), "difficulty": a + b})
    return datasets.Dataset.from_list(rows)


def content(completion) -> str:
    return completion if isinstance(completion, str) else completion[0]["content"]


def digit_share(prompts, completions, **kwargs):
    """A dense reward the tiny random model's perturbed members score differently on: the share of digits."""
    return [sum(ch.isdigit() for ch in content(c)) / max(1, len(content(c))) for c in completions]


def args(out, **over) -> ESConfig:
    base = dict(output_dir=str(out), max_steps=3, population_size=4, prompts_per_member=2, max_completion_length=6,
                sigma=0.05, sigma_min=0.01, learning_rate=0.02, save_steps=1, report_to="none", seed=3)
    return ESConfig(**{**base, **over})


def test_reward_functions_get_trl_keywords_every_column_and_none_skips_a_function():
    seen = {}

    def exact(prompts, completions, answer, difficulty, **kwargs):
        seen.update(prompts=prompts, completions=completions, answer=answer, difficulty=difficulty, extra=kwargs)
        return [1.0 if content(c).strip() == a else 0.0 for c, a in zip(completions, answer)]

    def abstains(prompts, completions, **kwargs):
        return [None]

    def nan(prompts, completions, **kwargs):
        return [math.nan]

    env = PromptDatasetEnv(list(sums(conversational=True)), [exact, abstains, nan], reward_weights=[2.0, 5.0, 7.0])
    env.reset(seed=5)  # row 5: 1+1=
    _, reward, terminated, truncated, info = env.step(" 2 ")
    assert (reward, terminated, truncated, info["is_success"]) == (2.0, True, False, True)
    assert info["rewards"] == {"exact": 1.0, "abstains": None, "nan": None}
    # TRL's shapes: lists of one element per keyword; a conversational prompt's completion is an assistant message
    assert seen["prompts"] == [[{"role": "user", "content": "1+1="}]]
    assert seen["completions"] == [[{"role": "assistant", "content": " 2 "}]]
    assert (seen["answer"], seen["difficulty"], seen["extra"]) == (["2"], [2], {})
    # no function scores: reward 0 (TRL's nansum), not NaN
    env = PromptDatasetEnv(list(sums()), [abstains])
    env.reset(seed=0)
    assert env.step("x")[1] == 0.0


@pytest.mark.parametrize("bad, message", [
    (lambda prompts, completions, **kw: 1.0, "one float"),
    (lambda prompts, completions, **kw: [1.0, 2.0], "one float"),
])
def test_a_reward_function_with_the_wrong_shape_is_named(bad, message):
    with pytest.raises(ValueError, match=message):
        score_completion([bad], [1.0], "p", "c", {})


def test_plain_prompts_are_continued_as_they_are_and_chat_prompts_get_the_template(tmp_path):
    from esopt.engines.base import SamplingParams
    from esopt.rollout.engine import run_episodes

    policy = load_policy("tiny")
    for conversational in (False, True):
        rows = list(sums(4, conversational))
        greedy = SamplingParams(temperature=0.0, max_new_tokens=3)
        traj = run_episodes(policy, lambda rows=rows: PromptDatasetEnv(rows, [digit_share]), [2], greedy, seed=0)[0][0]
        if conversational:
            expected = policy.build_prompt(rows[2]["prompt"])
            assert traj.turns[0].prompt_ids == policy.tokenizer(expected, add_special_tokens=False)["input_ids"]
        else:  # tokenized as TRL tokenizes a raw prompt: with the tokenizer's special tokens
            expected = rows[2]["prompt"]
            assert traj.turns[0].prompt_ids == policy.tokenizer(expected)["input_ids"]
        assert traj.turns[0].prompt.endswith(expected)


def test_a_run_writes_the_usual_run_dir_that_replays_and_loads_in_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    trainer = ESTrainer(model="tiny", reward_funcs=digit_share, train_dataset=sums(), eval_dataset=sums(4),
                        args=args(out))
    summary = trainer.train(progress=False)
    assert summary["steps_done"] == 3
    history = read_history(out / "history.jsonl")
    assert len(history) == 3 and any(len(set(r["rewards"])) > 1 for r in history), \
        "every generation scored its members alike: the test would check nothing"
    final = load_file(str(out / "final" / "model.safetensors"))
    base = load_policy("tiny").model
    before = {k: v.clone() for k, v in base.state_dict().items()}
    replay(base, out / "history.jsonl")
    moved = 0
    for name, tensor in base.state_dict().items():
        if name in final:
            assert torch.equal(tensor, final[name]), name
            moved += not torch.equal(tensor, before[name])
    assert moved > 0
    loaded = AutoModelForCausalLM.from_pretrained(out / "final")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in final.items())
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2, 3]
    assert not (out / "tb").exists()  # report_to="none"
    quiet = ESTrainer("tiny", digit_share, sums(), args=args(tmp_path / "q", report_to=[]))
    assert quiet.config.tensorboard is False  # [] reports nowhere, as in TRL


def test_resume_from_checkpoint_continues_a_stopped_run_to_the_same_weights(tmp_path, monkeypatch):
    import esopt.population.local as local

    whole, part = tmp_path / "whole", tmp_path / "part"
    ESTrainer("tiny", [digit_share], sums(), args=args(whole, max_steps=4)).train(progress=False)
    real, calls = local.run_member, {"n": 0}

    def ctrl_c_in_generation_3(*a, **kw):
        calls["n"] += 1
        if calls["n"] > 8:  # the 4 members of generations 1 and 2 finish
            raise KeyboardInterrupt
        return real(*a, **kw)

    with monkeypatch.context() as m:
        m.setattr(local, "run_member", ctrl_c_in_generation_3)
        stopped = ESTrainer("tiny", [digit_share], sums(), args=args(part, max_steps=4)).train(progress=False)
    assert stopped["interrupted"] and stopped["steps_done"] == 2
    with pytest.raises(FileExistsError, match="resume_from_checkpoint"):
        ESTrainer("tiny", [digit_share], sums(), args=args(part, max_steps=4)).train(progress=False)
    resumed = ESTrainer("tiny", [digit_share], sums(), args=args(part, max_steps=4))
    assert resumed.train(resume_from_checkpoint=True, progress=False)["steps_done"] == 4
    a, b = load_file(str(whole / "final/model.safetensors")), load_file(str(part / "final/model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_model_object_is_saved_once_as_the_runs_base(tmp_path):
    policy = load_policy("tiny", seed=7)
    with pytest.raises(ValueError, match="processing_class"):
        ESTrainer(policy.model, digit_share, sums(), args=args(tmp_path / "a"))
    trainer = ESTrainer(policy.model, digit_share, sums(), args=args(tmp_path / "b", max_steps=1),
                        processing_class=policy.tokenizer)
    assert trainer.config.model.name == str(tmp_path / "b" / "base_model")
    trainer.train(progress=False)
    replayed = replay(load_policy(str(tmp_path / "b" / "base_model")).model, tmp_path / "b" / "history.jsonl")
    final = load_file(str(tmp_path / "b" / "final/model.safetensors"))
    state = replayed.state_dict()
    assert all(torch.equal(state[k], v) for k, v in final.items())


@pytest.mark.parametrize("make, message", [
    (lambda o: ESTrainer("tiny", digit_share, [{"text": "no prompt"}], args=args(o)), "row 0: needs a 'prompt'"),
    (lambda o: ESTrainer("tiny", digit_share, [], args=args(o)), "train_dataset has no rows"),
    (lambda o: ESTrainer("tiny", [], sums(), args=args(o)), "reward_funcs"),
    (lambda o: ESTrainer("tiny", [digit_share], sums(), args=args(o, reward_weights=[1.0, 2.0])), "2 reward_weights"),
    (lambda o: ESTrainer("no-such-model", digit_share, sums(), args=args(o)).train(), "unknown model"),
    (lambda o: args(o, population_size=5), "population_size 5 must be even"),
    (lambda o: args(o, learning_rate=-1), "learning_rate"),
    (lambda o: ESTrainer("tiny", torch.nn.Linear(1, 1), sums(), args=args(o)), "is a model"),
    (lambda o: ESTrainer("tiny", digit_share, sums(), args=args(o, sigma=0.1, sigma_min=1.0)),
     "ESConfig: es: sigma_min (1.0) must not exceed sigma"),
    (lambda o: args(o, num_generations=8), "num_generations is GRPOConfig's, not ES's: ES scores population_size"),
])
def test_bad_arguments_give_one_line_errors(tmp_path, make, message):
    with pytest.raises((ValueError, ConfigError, FileNotFoundError)) as e:
        make(tmp_path / "out")
    assert message in str(e.value) and "\n" not in str(e.value)


def _run_trl_swap(out, *flags):
    """examples/trl_swap.py --smoke FLAGS in a child process (one torch thread); its --out dir."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "trl_swap.py"
    subprocess.run([sys.executable, str(script), "--smoke", *flags, "--out", str(out)], check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, timeout=600)
    return out


@pytest.mark.slow
def test_the_trl_swap_example_runs_both_trainers_from_one_script_at_its_smoke_size(tmp_path):
    """examples/trl_swap.py --smoke: TRL's GRPOTrainer, ESTrainer and esopt's GRPO, each in its own process on the
    same tiny model and rows, then the same greedy test eval; every trainer wrote a model the eval loaded."""
    from pathlib import Path

    pytest.importorskip("trl")
    out = _run_trl_swap(tmp_path / "swap")
    results = json.loads((out / "results.json").read_text())
    assert set(results["scores"]) == {"base", "trl-grpo", "es", "esopt-grpo"}
    assert len({len(v) for v in results["scores"].values()}) == 1  # every model scored on the same rows
    for name in ("trl-grpo", "es", "esopt-grpo"):
        r = results["results"][name]
        assert r["peak_rss_bytes"] > 0 and r["seconds_per_step"] > 0
        assert (Path(r["final"]) / "model.safetensors").exists()
    assert len(read_history(out / "es" / "history.jsonl")) == 2
    table = (out / "trl_side_by_side.md").read_text()
    assert all(f"| {name} |" in table for name in ("base", "trl-grpo", "es", "esopt-grpo"))


@pytest.mark.slow
def test_trl_swap_runs_es_batched_with_lowrank_noise(tmp_path):
    """--es-noise lowrank --batched reaches ESTrainer: its run dir records both, it trains its steps, and the
    report says which ES it was."""

    from esopt.train.config import load_config

    pytest.importorskip("reasoning_gym")
    out = _run_trl_swap(tmp_path / "swap", "--trainers", "es", "--es-noise", "lowrank", "--batched")
    es = load_config(out / "es" / "config.yaml").es
    assert (es.noise, es.batched) == ("lowrank", True)
    assert len(read_history(out / "es" / "history.jsonl")) == 2
    assert "lowrank batched" in (out / "trl_side_by_side.md").read_text()


def _trl_swap():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "trl_swap.py"
    spec = importlib.util.spec_from_file_location("trl_swap", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_trl_swap_tunes_on_validation_rows_and_reports_on_disjoint_test_rows():
    import argparse

    pytest.importorskip("reasoning_gym")
    swap = _trl_swap()
    a = argparse.Namespace(train_rows=64, test_rows=64, seed=1, split="validation")
    key = lambda r: json.dumps(r["prompt"])  # noqa: E731
    train = {key(r) for r in swap.arithmetic_rows(64, seed=1)}
    validation = swap.eval_rows(a)
    test = swap.eval_rows(argparse.Namespace(**{**vars(a), "split": "test"}))
    assert len(validation) > 32 and len(test) > 32
    held = {key(r) for r in validation}
    assert not held & train and not {key(r) for r in test} & (train | held)


def test_trl_swap_pools_runs_into_one_paired_table(tmp_path):
    swap = _trl_swap()
    outs = []
    for i, (base, es) in enumerate([([0, 0, 1, 0], [1, 0, 1, 0]), ([0, 1, 0, 0], [1, 1, 1, 0])]):
        out = tmp_path / f"s{i}"
        out.mkdir()
        (out / "results.json").write_text(json.dumps({
            "scores": {"base": base, "es": es},
            "results": {"es": {"seconds_per_step": 2.0, "peak_rss_bytes": 2**30}}}))
        outs.append(str(out))
    table = swap.pool(outs)
    assert "Pooled over 2 runs (8 tasks" in table
    assert "| es | 0.625 | +0.375 [" in table  # 5/8 after vs 2/8 before, paired over the 8 tasks
    assert "trl-grpo" not in table  # a trainer missing from a run is not pooled


def test_trl_swap_runs_sharing_one_out_merge_their_trainers_and_refuse_other_rows():
    """Each trainer may run with its own tuned settings (or on its own core) into one OUT: the results add up,
    a trainer run again replaces its entry, and a run on other rows or another budget is refused."""
    import argparse

    swap = _trl_swap()
    a = argparse.Namespace(model="smollm2", split="test", seed=0, train_rows=512, test_rows=256, max_tokens=16,
                           threads=1, steps=30, budget="flops")
    key = swap.comparison_key(a)
    first = swap.merge_results(None, key, {"es": {"settings": "es1"}}, {"base": [0, 1], "es": [1, 1]})
    both = swap.merge_results(first, key, {"trl-grpo": {"settings": "g"}}, {"base": [0, 1], "trl-grpo": [0, 0]})
    assert set(both["scores"]) == {"base", "es", "trl-grpo"} and both["results"]["es"]["settings"] == "es1"
    again = swap.merge_results(both, key, {"es": {"settings": "es2"}}, {"base": [0, 1], "es": [0, 1]})
    assert again["scores"]["es"] == [0, 1] and again["results"]["es"]["settings"] == "es2"
    for change in ({"seed": 1}, {"steps": 10}, {"split": "validation"}):
        with pytest.raises(SystemExit, match="use another --out"):
            swap.merge_results(both, swap.comparison_key(argparse.Namespace(**{**vars(a), **change})), {}, {})


def test_trl_swap_es_may_roll_out_greedy_while_the_grpos_sample():
    import argparse

    swap = _trl_swap()
    a = argparse.Namespace(temperature=1.0, es_temperature=0.0, prompts=4, group=8, lr=1e-5, lr_schedule="linear",
                           population=8, budget="flops", sigma=3e-3, es_lr=3e-3, es_noise="lowrank", batched=True)
    assert swap.temperature("es", a) == 0.0 and swap.temperature("trl-grpo", a) == 1.0
    assert swap.settings("es", a) == "32 x 4, sigma 0.003->0.0015, alpha 0.003, lowrank batched, T 0"
    assert swap.settings("esopt-grpo", a) == "4 x 8, lr 1e-05 linear, T 1"
    assert swap.temperature("es", argparse.Namespace(**{**vars(a), "es_temperature": None})) == 1.0


# --- TRL's environment_factory: multi-turn tool use with the same environment class ----------------------------

class Counter:
    """A TRL-style environment: reset gets the row's columns; public methods are tools; get_reward scores."""

    def reset(self, **row):
        self.total, self.target = 0, int(row["answer"])
        return f"Reach {self.target} with add."

    def add(self, n: int) -> str:
        """Add to the running total.

        Args:
            n: how much to add
        """
        self.total += n
        return f"total {self.total}"

    def get_reward(self) -> float:
        return float(self.total == self.target)


def test_an_environment_class_gives_tools_a_multi_turn_episode_and_its_reward():
    from esopt.envs.environment import EnvironmentToolEnv

    seen = {}

    def says_done(prompts, completions, environments, answer, **kwargs):
        seen.update(completions=completions, environments=environments, answer=answer)
        return [0.5 if "done" in completions[0][-1]["content"] else 0.0]

    env = EnvironmentToolEnv(Counter, list(sums(conversational=True)), [says_done], reward_weights=[2.0])
    _, info = env.reset(seed=6)  # row 6: 2+1=, answer 3
    system, user = info["prompt"][0], info["prompt"][-1]
    assert system["role"] == "system" and "add(n): Add to the running total." in system["content"]
    assert user["content"] == "2+1=\n\nReach 3 with add."
    assert env.step("I add two. <add>2</add>")[0] == "Observation: total 2"
    obs, reward, terminated, _, _ = env.step("<add>{\"n\": 1}</add>")
    assert (obs, reward, terminated) == ("Observation: total 3", 0.0, False)
    _, reward, terminated, truncated, info = env.step("done")  # no tool call: the final answer, as in TRL
    assert (terminated, truncated, info["is_success"]) == (True, False, True)
    assert reward == 2.0 * 0.5 + 1.0 and info["rewards"] == {"says_done": 0.5, "Counter": 1.0}
    assert [m["role"] for m in seen["completions"][0]] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert seen["environments"][0].total == 3 and seen["answer"] == ["3"]


def test_an_episode_out_of_turns_is_scored_as_it_stands():
    from esopt.envs.environment import EnvironmentToolEnv

    env = EnvironmentToolEnv(Counter, list(sums(conversational=True)), max_turns=2)
    env.reset(seed=6)
    env.step("<add>2</add>")
    _, reward, terminated, truncated, info = env.step("<add>1</add>")  # reaches 3 on the last turn
    assert (terminated, truncated, reward, info["rewards"]) == (False, True, 1.0, {"Counter": 1.0})


class Settings:
    """Typed tool inputs (TRL's schemas) and a reward that abstains."""

    def reset(self, **row):
        self.seen = None

    def configure(self, flag: bool, sizes: list[int], name: str = "x") -> str:
        """Store settings.

        Args:
            flag: a switch
            sizes: some sizes
            name: a name
        """
        self.seen = (flag, sizes, name)
        return "ok"

    def get_reward(self):
        return None if self.seen is None else float(self.seen[0] is False)


def test_tool_inputs_keep_their_types_and_a_none_reward_abstains():
    from esopt.envs.environment import EnvironmentToolEnv

    rows = [{"prompt": [{"role": "user", "content": "Réglez 2×3 ≈ π"}], "answer": "6"}]
    env = EnvironmentToolEnv(Settings, rows)
    _, info = env.reset(seed=0)
    assert info["prompt"][-1]["content"] == "Réglez 2×3 ≈ π"  # the row's text as written, not its ASCII shadow
    obs = env.step('<configure>{"flag": false, "sizes": [1, 2]}</configure>')[0]
    assert obs == "Observation: ok" and env.instance.seen == (False, [1, 2], "x")
    assert env.step("fine")[1] == 1.0
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("nothing to do")
    assert terminated and reward == 0.0 and info["rewards"] == {"Settings": None}
    env.reset(seed=0)
    assert "must be a boolean" in env.step('<configure>{"flag": "maybe", "sizes": []}</configure>')[0]


def test_a_raw_prompt_starts_with_bos_where_the_tokenizer_adds_one():
    from types import SimpleNamespace

    from esopt.rollout.engine import with_bos

    class Tok:
        bos_token, bos_token_id = "<s>", 1

        def __init__(self, adds):
            self.adds = adds

        def __call__(self, text):
            return {"input_ids": ([1] if self.adds else []) + [5]}

    assert with_bos(SimpleNamespace(tokenizer=Tok(True)), "2+2=") == "<s>2+2="
    assert with_bos(SimpleNamespace(tokenizer=Tok(True)), "<s>2+2=") == "<s>2+2="
    assert with_bos(SimpleNamespace(tokenizer=Tok(False)), "2+2=") == "2+2="
    assert with_bos(SimpleNamespace(tokenizer=None), "2+2=") == "2+2="


def test_environments_that_cannot_work_are_refused_with_the_reason():
    from esopt.envs.environment import EnvironmentToolEnv

    class Undocumented:
        def reset(self, **row):
            return None

        def look(self, x: int) -> str:
            return str(x)

    with pytest.raises(ValueError, match="Undocumented.look: .*docstring"):
        EnvironmentToolEnv(Undocumented, list(sums(conversational=True)), [digit_share])
    with pytest.raises(ValueError, match="conversational prompts"):
        EnvironmentToolEnv(Counter, list(sums()), [digit_share])
    with pytest.raises(ValueError, match="no reward"):
        EnvironmentToolEnv(lambda: Undocumented(), list(sums(conversational=True)))

    class CamelCase(Counter):
        def addTwo(self, n: int) -> str:
            """Add two.

            Args:
                n: ignored
            """
            return ""

    with pytest.raises(ValueError, match="CamelCase.addTwo: tool names are lower_snake_case"):
        EnvironmentToolEnv(CamelCase, list(sums(conversational=True)))
    with pytest.raises(ValueError, match="no reset"):
        EnvironmentToolEnv(type("NoReset", (), {"get_reward": lambda self: 0.0}), list(sums(conversational=True)))


def test_es_trainer_trains_through_an_environment_factory(tmp_path):
    out = tmp_path / "env"
    trainer = ESTrainer("tiny", None, sums(conversational=True), environment_factory=Counter,
                        args=args(out, max_steps=2, max_tool_calling_iterations=2, max_completion_length=8))
    assert trainer.config.env.conversation == "history"
    summary = trainer.train(progress=False)
    assert summary["steps_done"] == 2 and len(read_history(out / "history.jsonl")) == 2


def test_a_tool_using_episode_runs_turn_by_turn_with_its_history():
    """The rollout engine drives the environment for several turns in history mode: each prompt holds the
    earlier calls and their observations; the episode ends on the reply without a call and gets its reward."""
    import re

    from esopt.engines.base import Completion, SamplingParams
    from esopt.envs.environment import EnvironmentToolEnv
    from esopt.rollout.engine import run_episodes

    class AddsOneUntilThere:
        tokenizer, model, prompts = None, torch.nn.Linear(1, 1), []
        device = torch.device("cpu")

        def build_prompt(self, messages):
            return "|".join(f"{m['role']}:{m['content']}" for m in messages)

        def generate(self, prompts, sampling, seed=None, return_logprobs=False, **kwargs):
            self.prompts += prompts
            out = []
            for p in prompts:
                target, totals = int(re.search(r"Reach (\d+)", p).group(1)), re.findall(r"total (\d+)", p)
                text = "done" if totals and int(totals[-1]) == target else "<add>1</add>"
                out.append(Completion(prompt_ids=[1], token_ids=[2], text=text))
            return out

    policy = AddsOneUntilThere()
    rows = list(sums(conversational=True))
    (traj,), _ = run_episodes(policy, lambda: EnvironmentToolEnv(Counter, rows, max_turns=6), [6],
                              SamplingParams(max_new_tokens=8), conversation="history")
    assert [t.text for t in traj.turns] == ["<add>1</add>"] * 3 + ["done"]
    assert traj.success and traj.reward == 1.0 and traj.turns[-1].terminated
    assert policy.prompts[2].count("assistant:<add>1</add>") == 2 and "user:Observation: total 2" in policy.prompts[2]


TRACKIO_RUN = """
import json, sys
import datasets
from esopt import ESConfig, ESTrainer
from trackio.sqlite_storage import SQLiteStorage
rows = [{"prompt": f"{i % 4}+{i // 4}=", "answer": str(i % 4 + i // 4)} for i in range(8)]
def digit_share(prompts, completions, **kwargs):
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]
out = sys.argv[1]
ESTrainer("tiny", digit_share, datasets.Dataset.from_list(rows), args=ESConfig(
    output_dir=out, max_steps=2, population_size=4, prompts_per_member=2, max_completion_length=4, sigma=0.05,
    sigma_min=0.01, learning_rate=0.02, report_to=["trackio"], project="esopt-test", seed=3)).train(progress=False)
print(json.dumps({"runs": SQLiteStorage.get_runs("esopt-test"), "logs": SQLiteStorage.get_logs("esopt-test", "run")},
                 default=str))
"""


def test_report_to_trackio_logs_every_metric_to_a_local_trackio_run(tmp_path):
    """TRL's default logger: the run's scalars go to a trackio run named after the run dir, in TRACKIO_DIR."""
    import os
    import subprocess
    import sys

    pytest.importorskip("trackio")
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}  # read when trackio is imported: a child
    done = subprocess.run([sys.executable, "-c", TRACKIO_RUN, str(tmp_path / "run")], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["runs"] == ["run"]
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = {r["step"]: r for r in metrics if r["kind"] == "train"}
    logged = {r["step"]: r for r in got["logs"] if "train/reward_mean" in r}
    assert sorted(logged) == sorted(train) == [1, 2]
    for step, row in train.items():
        assert logged[step]["train/reward_mean"] == pytest.approx(row["reward_mean"], rel=0, abs=0)
        assert logged[step]["train/sigma"] == row["sigma"]
    evals = {r["step"]: r["success_rate"] for r in metrics if r["kind"] == "eval"}
    assert {r["step"]: r["eval/success_rate"] for r in got["logs"] if "eval/success_rate" in r} == evals
    assert sorted(evals) == [0, 2]
    assert (tmp_path / "trackio").is_dir() and not (tmp_path / "run" / "tb").exists()


def test_report_to_trackio_without_trackio_says_what_to_install(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trackio" else real(name, *a))
    trainer = ESTrainer("tiny", digit_share, sums(), args=args(tmp_path / "run", report_to="trackio"))
    with pytest.raises(ConfigError, match="trackio is not installed") as e:
        trainer.train(progress=False)
    assert "\n" not in str(e.value) and not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="trackio logs stay on this machine"):
        args(tmp_path, trackio_space_id="me/space")
