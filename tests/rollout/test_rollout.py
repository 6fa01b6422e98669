"""The multi-turn rollout engine: lockstep batching, determinism, prompts, exact token ids."""

from __future__ import annotations

import importlib.util
import re

import gymnasium as gym
import pytest
import torch

from esopt.engines.base import Completion, SamplingParams
from esopt.rollout import RolloutStats, Trajectory, markov_messages, run_episodes, turn_seed


class GuessEnv(gym.Env):
    """Guess a hidden digit 0-9 (drawn from the reset seed); feedback says higher/lower; 4 turns."""

    instructions = "Guess the hidden digit (0-9). Answer with one digit."

    def __init__(self, max_turns: int = 4) -> None:
        self.max_turns = max_turns
        self.target = 0
        self.turn = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = int(self.np_random.integers(10))
        self.turn = 0
        return "Guess a digit.", {}

    def step(self, action: str):
        self.turn += 1
        m = re.search(r"\d", action)
        valid = m is not None
        guess = int(m.group()) if valid else -1
        success = guess == self.target
        if not valid:
            feedback = "invalid"
        elif success:
            feedback = "correct"
        else:
            feedback = "higher" if guess < self.target else "lower"
        terminated = success
        truncated = not terminated and self.turn >= self.max_turns
        info = {"is_success": success, "action_is_valid": valid, "turn": self.turn, "feedback": feedback}
        obs = f"Last guess: {guess}, {feedback}. Turn {self.turn}."
        return obs, (1.0 if success else 0.0), terminated, truncated, info


class BisectPolicy:
    """A scripted policy that bisects using the feedback in the (markov) prompt."""

    model = torch.nn.Linear(1, 1)
    tokenizer = None

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def build_prompt(self, messages):
        return "|".join(f"{m['role']}:{m['content']}" for m in messages)

    def generate(self, prompts, sampling, seed=None, return_logprobs=False):
        self.seen.append(prompts)
        out = []
        for p in prompts:
            lo, hi = 0, 9
            for g, fb in re.findall(r"Last guess: (-?\d+), (\w+)", p):
                if fb == "higher":
                    lo = int(g) + 1
                elif fb == "lower":
                    hi = int(g) - 1
            text = str((lo + hi) // 2)
            out.append(Completion(prompt_ids=[1, 2], token_ids=[ord(text)], text=text))
        return out


SAMPLING = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8)


def _replay(traj: Trajectory) -> list[str]:
    """Observations seen before each turn, by replaying the actions on a fresh env."""
    env = GuessEnv()
    obs, _ = env.reset(seed=traj.task_seed)
    seen = [obs]
    for turn in traj.turns:
        obs, reward, terminated, truncated, info = env.step(turn.text)
        assert reward == turn.reward and terminated == turn.terminated and truncated == turn.truncated
        assert info == turn.info
        assert turn.observation == str(seen[-1])  # the observation this turn answered
        seen.append(obs)
    return seen


def test_rollout_sixteen_episodes_consistent(policy):
    seeds = list(range(100, 116))
    trajs, stats = run_episodes(policy, GuessEnv, seeds, SAMPLING, seed=3)
    assert isinstance(stats, RolloutStats)
    assert [t.task_seed for t in trajs] == seeds
    assert stats.episodes == 16 and stats.turns == sum(t.num_turns for t in trajs)
    assert stats.generated_tokens == sum(len(tu.token_ids) for t in trajs for tu in t.turns)
    assert stats.prompt_tokens == sum(len(tu.prompt_ids) for t in trajs for tu in t.turns)
    assert stats.seconds >= stats.generate_seconds > 0 and stats.tokens_per_second > 0
    for traj in trajs:
        assert 1 <= traj.num_turns == len(traj.turns) <= 4
        assert traj.turns[-1].done and not any(t.done for t in traj.turns[:-1])
        assert traj.reward == sum(t.reward for t in traj.turns)
        assert traj.success == traj.turns[-1].info["is_success"]
        assert all(len(t.token_ids) <= SAMPLING.max_new_tokens for t in traj.turns)
        assert all(t.logprobs is None for t in traj.turns)
        _replay(traj)


def test_same_seed_same_trajectories_different_seed_differs(policy):
    seeds = list(range(8))
    a, _ = run_episodes(policy, GuessEnv, seeds, SAMPLING, seed=1)
    b, _ = run_episodes(policy, GuessEnv, seeds, SAMPLING, seed=1)
    c, _ = run_episodes(policy, GuessEnv, seeds, SAMPLING, seed=2)
    ids = [[t.token_ids for t in traj.turns] for traj in a]
    assert ids == [[t.token_ids for t in traj.turns] for traj in b]
    assert ids != [[t.token_ids for t in traj.turns] for traj in c]


def test_turn_seed_deterministic_and_distinct():
    assert turn_seed(0, 1, 0) == turn_seed(0, 1, 0)
    assert len({turn_seed(s, t, c) for s in range(3) for t in range(5) for c in range(3)}) == 45
    assert 0 <= turn_seed(-5, 0) < 2**63


def test_markov_prompts(policy):
    trajs, _ = run_episodes(policy, GuessEnv, [1, 2, 3], SAMPLING, seed=0, conversation="markov")
    for traj in trajs:
        obs = _replay(traj)
        for i, turn in enumerate(traj.turns):
            expected = policy.build_prompt(markov_messages(GuessEnv.instructions, obs[i]))
            assert turn.prompt == expected == obs[i] + "\n>"  # tiny template drops the system prompt
            assert turn.prompt_ids == policy.tokenizer(turn.prompt, add_special_tokens=False)["input_ids"]


def test_history_prompts():
    fake = BisectPolicy()
    trajs, _ = run_episodes(
        fake, GuessEnv, [5], SamplingParams(), conversation="history", system_prompt="SYS"
    )
    (traj,) = trajs
    obs = _replay(traj)
    messages = [{"role": "system", "content": "SYS"}, {"role": "user", "content": obs[0]}]
    for i, turn in enumerate(traj.turns):
        assert turn.prompt == fake.build_prompt(messages)
        messages += [{"role": "assistant", "content": turn.text}, {"role": "user", "content": obs[i + 1]}]


def test_scripted_policy_rewards_and_success():
    fake = BisectPolicy()
    seeds = list(range(20))
    trajs, stats = run_episodes(
        fake, GuessEnv, seeds, SamplingParams(), conversation="history", max_batch_size=3
    )
    # bisection over 0-9 finds the digit within 4 guesses
    assert all(t.success and t.reward == 1.0 and t.terminated for t in trajs)
    assert stats.turns == sum(t.num_turns for t in trajs)
    assert max(len(p) for p in fake.seen) == 3  # chunked
    assert all(t.valid_action_rate == 1.0 for t in trajs)
    # prompts carry the env instructions as the system message
    assert fake.seen[0][0] == f"system:{GuessEnv.instructions}|user:Guess a digit."


def test_token_ids_are_generated_ids_not_retokenized(policy):
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    trajs, _ = run_episodes(policy, GuessEnv, [0, 1, 2, 3], greedy, seed=0, return_logprobs=True)
    tok = policy.tokenizer
    for traj in trajs[:2]:
        for turn in traj.turns:
            assert tok.decode(turn.token_ids, skip_special_tokens=True) == turn.text
            # teacher forcing: each kept id is the argmax after prompt + previous ids
            ids = torch.tensor([turn.prompt_ids + turn.token_ids])
            with torch.no_grad():
                logits = policy.model(ids).logits[0, len(turn.prompt_ids) - 1 : -1]
            assert logits.argmax(-1).tolist() == turn.token_ids
            assert len(turn.logprobs) == len(turn.token_ids) and max(turn.logprobs) <= 0


def test_special_tokens_kept_in_ids(policy):
    """Ids the text cannot reproduce (e.g. <pad>, <bos>) stay in token_ids: no re-tokenization."""
    hot = SamplingParams(temperature=3.0, top_p=1.0, top_k=0, max_new_tokens=32)
    trajs, _ = run_episodes(policy, GuessEnv, list(range(16)), hot, seed=0)
    specials = set(policy.tokenizer.all_special_ids) - {policy.tokenizer.eos_token_id}
    hits = [t for traj in trajs for t in traj.turns if specials & set(t.token_ids)]
    assert hits, "expected some sampled special tokens at T=3"
    turn = hits[0]
    assert policy.tokenizer(turn.text, add_special_tokens=False)["input_ids"] != turn.token_ids


def test_logprobs_lengths(policy):
    trajs, _ = run_episodes(policy, GuessEnv, list(range(6)), SAMPLING, seed=4, return_logprobs=True)
    for traj in trajs:
        for turn in traj.turns:
            assert len(turn.logprobs) == len(turn.token_ids)
            assert all(lp <= 0 for lp in turn.logprobs)


def test_chunked_batches_are_deterministic(policy):
    seeds = list(range(10))
    a, _ = run_episodes(policy, GuessEnv, seeds, SAMPLING, seed=7, max_batch_size=4)
    b, _ = run_episodes(policy, GuessEnv, seeds, SAMPLING, seed=7, max_batch_size=4)
    assert [t.turns[0].token_ids for t in a] == [t.turns[0].token_ids for t in b]


def test_max_turns_truncates_and_envs_closed(policy):
    closed = []

    class Closing(GuessEnv):
        def close(self):
            closed.append(1)

    trajs, _ = run_episodes(
        policy,
        lambda: Closing(max_turns=100),
        [0, 1],
        SamplingParams(temperature=0, max_new_tokens=2),
        max_turns=2,
    )
    assert all(t.num_turns <= 2 for t in trajs)
    assert all(t.turns[-1].done for t in trajs)
    assert len(closed) == 2


def test_bad_arguments(policy):
    with pytest.raises(ValueError, match="conversation"):
        run_episodes(policy, GuessEnv, [0], SAMPLING, conversation="full")
    with pytest.raises(ValueError, match="max_batch_size"):
        run_episodes(policy, GuessEnv, [0], SAMPLING, max_batch_size=0)


HAS_SUDOKU = importlib.util.find_spec("esopt.envs.sudoku") is not None


@pytest.mark.skipif(not HAS_SUDOKU, reason="esopt.envs.sudoku not written yet")
def test_sudoku_rollout_consistent_with_env(policy):
    import esopt.envs  # noqa: F401  (registers esopt/Sudoku-v0)

    def make():
        return gym.make("esopt/Sudoku-v0", size=4, h_star=3)

    seeds = list(range(8))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12)
    trajs, stats = run_episodes(policy, make, seeds, sampling, seed=0)
    assert stats.turns == sum(t.num_turns for t in trajs)
    for traj in trajs:
        env = make()
        obs, _ = env.reset(seed=traj.task_seed)
        for turn in traj.turns:
            assert turn.prompt == policy.build_prompt(markov_messages(env.unwrapped.instructions, obs))
            obs, reward, terminated, truncated, info = env.step(turn.text)
            assert (reward, terminated, truncated) == (turn.reward, turn.terminated, turn.truncated)
        assert traj.turns[-1].done
        assert traj.success == bool(traj.turns[-1].info.get("is_success", False))
        env.close()


def test_history_context_budget_drops_oldest_exchanges(policy):
    """The tiny model's tokenizer is one token per character, so the budget is exact in characters."""
    sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=4)
    full, _ = run_episodes(policy, GuessEnv, [5, 6], sampling, seed=1, conversation="history", system_prompt="S")
    longest = max(len(t.prompt_ids) for tr in full for t in tr.turns)
    budget = 90
    assert longest > budget  # without a budget the history outgrows it
    cut, _ = run_episodes(policy, GuessEnv, [5, 6], sampling, seed=1, conversation="history", system_prompt="S",
                          max_prompt_tokens=budget)
    for traj in cut:
        obs = _replay(traj)
        for i, turn in enumerate(traj.turns):
            assert len(turn.prompt_ids) <= budget
            assert obs[i] in turn.prompt  # the current observation is always there
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        run_episodes(policy, GuessEnv, [5], sampling, conversation="history", max_prompt_tokens=0)


def test_stop_strings_cut_text_and_tokens(policy):
    from esopt.engines.base import cut_at_stop

    tok = policy.tokenizer  # one character per token: a cut at character k keeps k tokens
    ids = tok("abc STOP def", add_special_tokens=False)["input_ids"]
    done = cut_at_stop(Completion([1], ids, "abc STOP def", [0.0] * len(ids)), ("STOP", "zz"), tok.decode)
    assert done.text == "abc " and tok.decode(done.token_ids) == "abc STOP" and len(done.logprobs) == 8
    untouched = Completion([1], ids, "abc STOP def")
    assert cut_at_stop(untouched, ("nope",), tok.decode) is untouched
    # the earliest stop string wins, whatever its place in the list; one at the very start leaves nothing
    both = cut_at_stop(Completion([1], ids, "abc STOP def"), ("def", "c S"), tok.decode)
    assert both.text == "ab" and tok.decode(both.token_ids) == "abc S"
    start = cut_at_stop(Completion([1], ids, "abc STOP def"), ("abc",), tok.decode)
    assert start.text == "" and tok.decode(start.token_ids) == "abc"
    # through generate: a two-character stop string the model actually writes; every row is cut just before
    # its first occurrence (text) and just after it (tokens), rows without it are left whole
    free = policy.generate(["Last guess: 3"] * 4, SAMPLING, seed=7)
    text = next(c.text for c in free if len(c.text) >= 4)
    stop = text[2:4]
    cut = policy.generate(["Last guess: 3"] * 4, SamplingParams(1.0, 1.0, 0, 8, stop=(stop,)), seed=7)
    assert len(cut) == len(free) == 4
    for a, b in zip(free, cut):
        chars = [tok.decode([t], skip_special_tokens=True) for t in a.token_ids]  # "" for a special token
        assert "".join(chars) == a.text and all(len(c) <= 1 for c in chars)
        at = a.text.find(stop)
        if at < 0:
            assert (b.text, b.token_ids) == (a.text, a.token_ids)
        else:  # tokens up to the one that writes the stop string's last character
            visible = [k for k, c in enumerate(chars) if c]  # token index of each character of the text
            assert b.text == a.text[:at] and b.token_ids == a.token_ids[: visible[at + len(stop) - 1] + 1]
    assert sum(stop in a.text for a in free) >= 1
    with pytest.raises(ValueError, match="stop strings"):
        SamplingParams(stop=("",))
