"""The multi-turn rollout engine shared by ES, GRPO and PPO.

All episodes run in lockstep: each turn, every still-active episode's prompt goes into ONE batched
`policy.generate` call (chunked by `max_batch_size`), then each env steps on its completion text.
The sampling seed of a turn is derived from (seed, turn, chunk), so the same (task_seeds, seed) gives
identical trajectories for identical weights: ES evaluates every population member on the same
tasks with the same seeds (common random numbers).

Two conversation modes:
- "markov": the prompt is [system, user(current observation)] every turn;
- "history": the prompt is the whole chat so far (system, user obs, assistant text, user obs, ...).

Generated token ids are kept exactly as produced (the RL baselines need them for log-prob ratios).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from esopt.engines.base import Completion, Engine, SamplingParams
from esopt.rollout.prompts import Examples, Message, count_tokens, markov_messages, resolve_system_prompt
from esopt.rollout.trajectory import RolloutStats, Trajectory, Turn


def turn_seed(seed: int, turn: int, chunk: int = 0) -> int:
    """The sampling seed of one generate call, derived from (seed, turn, chunk)."""
    state = np.random.SeedSequence([seed % 2**64, turn, chunk]).generate_state(1, np.uint64)[0]
    return int(state) >> 1  # fits torch.manual_seed and signed 64-bit


def with_bos(policy: Engine, text: str) -> str:
    """A raw text prompt started as its tokenizer starts text (TRL tokenizes raw prompts with special tokens):
    with the BOS token where the tokenizer adds one (Gemma, Llama), as it is where it adds none (SmolLM2)."""
    tokenizer = getattr(policy, "tokenizer", None)
    bos = getattr(tokenizer, "bos_token", None)
    if tokenizer is None or not bos or text.startswith(bos):
        return text
    ids = tokenizer("x")["input_ids"]
    return bos + text if ids and ids[0] == tokenizer.bos_token_id else text


class _Episode:
    """Book-keeping of one live episode."""

    def __init__(self, env: gym.Env, task_seed: int, system_prompt: str | None, conversation: str,
                 examples: Examples = ()) -> None:
        self.env = env
        self.system_prompt = system_prompt
        self.examples = examples
        self.conversation = conversation
        self.trajectory = Trajectory(task_seed=task_seed)
        self.done = False
        self.generated_tokens = 0
        obs, info = env.reset(seed=task_seed)
        self.obs = str(obs)
        # an env may give its whole opening itself (a dataset row's prompt): raw text to continue as it is, or the
        # chat messages; the system prompt and worked examples then come from it, not from the env's instructions
        opening = info.get("prompt") if isinstance(info, dict) else None
        self.raw_opening = opening if isinstance(opening, str) else None
        self.opening = [dict(m) for m in opening] if isinstance(opening, list) else None
        self.history: list[Message] = self.opening or markov_messages(system_prompt, self.obs, examples)
        # index of the first exchange a context budget may drop: an opening's question stays (it is the task)
        self.first_turn = len(self.history) - (0 if self.opening else 1)

    def messages(self) -> list[Message]:
        if self.conversation == "history":
            return self.history
        if self.opening is not None and self.trajectory.num_turns == 0:
            return self.opening
        return markov_messages(self.system_prompt, self.obs, self.examples)

    def drop_oldest_exchange(self) -> bool:
        """History mode over its context budget: forget the oldest (observation, action) exchange. The
        system prompt, the worked examples and the current observation always stay."""
        if len(self.history) - self.first_turn < 3:
            return False
        del self.history[self.first_turn : self.first_turn + 2]
        return True

    def prompt(self, policy: Engine, max_prompt_tokens: int | None) -> str:
        if self.raw_opening is not None and self.trajectory.num_turns == 0:
            return with_bos(policy, self.raw_opening)
        prompt = policy.build_prompt(self.messages())
        if max_prompt_tokens is None or self.conversation != "history":
            return prompt
        while count_tokens(policy, prompt) > max_prompt_tokens and self.drop_oldest_exchange():
            prompt = policy.build_prompt(self.messages())
        return prompt

    def step(self, prompt: str, gen: Completion, max_turns: int | None, max_episode_tokens: int | None = None) -> None:
        seen = self.obs
        obs, reward, terminated, truncated, info = self.env.step(gen.text)
        self.obs = str(obs)
        if max_turns is not None and self.trajectory.num_turns + 1 >= max_turns and not terminated:
            truncated = True
        self.generated_tokens += len(gen.token_ids)
        if max_episode_tokens is not None and self.generated_tokens >= max_episode_tokens and not terminated:
            truncated = True
        turn = Turn(
            prompt=prompt,
            prompt_ids=list(gen.prompt_ids),
            token_ids=list(gen.token_ids),
            text=gen.text,
            logprobs=None if gen.logprobs is None else list(gen.logprobs),
            reward=float(reward),
            terminated=bool(terminated),
            truncated=bool(truncated),
            info=dict(info),
            observation=seen,
        )
        self.trajectory.add(turn)
        self.done = turn.done
        if self.conversation == "history" and not self.done:
            self.history.append({"role": "assistant", "content": gen.text})
            self.history.append({"role": "user", "content": self.obs})


def run_episodes(
    policy: Engine,
    env_factory: Callable[[], gym.Env],
    task_seeds: list[int],
    sampling: SamplingParams,
    *,
    seed: int = 0,
    conversation: Literal["markov", "history"] = "markov",
    system_prompt: str | None = None,
    return_logprobs: bool = False,
    max_batch_size: int | None = None,
    max_turns: int | None = None,
    progress: bool = False,
    examples: Examples = (),
    max_prompt_tokens: int | None = None,
    members: Sequence[int] | None = None,
    max_episode_tokens: int | None = None,
    step_workers: int = 8,
) -> tuple[list[Trajectory], RolloutStats]:
    """Run one episode per task seed in lockstep; trajectories come back in task_seeds order.

    system_prompt None => each env's `unwrapped.instructions`. max_turns (optional) truncates episodes
    the env itself would not end; normally the env's own turn cap ends them. `examples`: worked
    (observation, action) exchanges placed as chat turns between the system prompt and the episode.
    max_prompt_tokens (history mode): the context budget; the oldest exchanges are dropped to fit it.
    members: the population member of every task seed, handed to the engine with each batch's prompts
    (a batched population's rows carry different members' weights). max_episode_tokens truncates an episode
    once its generated tokens reach it. Envs with `concurrent_steps = True` (tool use) are stepped in up to
    `step_workers` threads, so one slow tool call does not hold up the others.
    """
    _check_settings(conversation, max_batch_size, max_episode_tokens, max_prompt_tokens)
    if members is not None and len(members) != len(task_seeds):
        raise ValueError(f"{len(members)} members for {len(task_seeds)} task seeds")
    start = time.perf_counter()
    stats = RolloutStats(episodes=len(task_seeds))
    episodes: list[_Episode] = []
    bar = None
    scope = contextlib.ExitStack()
    try:
        for task_seed in task_seeds:
            env = env_factory()
            episodes.append(_Episode(env, int(task_seed), resolve_system_prompt(env, system_prompt), conversation,
                                     examples))
        if episodes:  # the env's own stop strings (a ReAct turn ends at its call), after the caller's
            extra = [x for x in getattr(episodes[0].env.unwrapped, "stop_strings", ()) if x not in sampling.stop]
            if extra:
                sampling = dataclasses.replace(sampling, stop=(*sampling.stop, *extra))
        if progress:
            from esopt.utils.progress import progress_bar

            bar = progress_bar(None, "rollout", leave=False, unit="turn")
        owner = {id(e): m for e, m in zip(episodes, members)} if members is not None else None
        if hasattr(policy, "rollout_scope"):  # weights are fixed during a rollout: the KV of the prompts' prefix
            # (and, where every prompt extends the last, each episode's own) may be kept from turn to turn
            scope.enter_context(policy.rollout_scope(growing=conversation == "history"))
        turn = 0
        while active := [e for e in episodes if not e.done]:
            prompts = [e.prompt(policy, max_prompt_tokens) for e in active]
            t0 = time.perf_counter()
            gens = _generate_turn(policy, active, prompts, sampling, turn_seeds=(seed, turn), owner=owner,
                                  max_batch_size=max_batch_size, return_logprobs=return_logprobs)
            stats.generate_seconds += time.perf_counter() - t0
            _step_envs(active, prompts, gens, max_turns, max_episode_tokens, step_workers)
            turn += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(f"active={len(active)}")
    finally:
        scope.close()
        if bar is not None:
            bar.close()
        for episode in episodes:
            episode.env.close()
    trajectories = [e.trajectory for e in episodes]
    for traj in trajectories:
        stats.turns += traj.num_turns
        stats.generated_tokens += traj.generated_tokens
        stats.prompt_tokens += traj.prompt_tokens
    stats.seconds = time.perf_counter() - start
    return trajectories, stats


def _check_settings(conversation: str, max_batch_size: int | None, max_episode_tokens: int | None,
                    max_prompt_tokens: int | None) -> None:
    if conversation not in ("markov", "history"):
        raise ValueError(f"conversation must be 'markov' or 'history', got {conversation!r}")
    for name, value in (("max_batch_size", max_batch_size), ("max_episode_tokens", max_episode_tokens),
                        ("max_prompt_tokens", max_prompt_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1 or None, got {value}")


def _generate_turn(policy: Engine, active: list[_Episode], prompts: list[str], sampling: SamplingParams,
                   turn_seeds: tuple[int, int], owner: dict[int, int] | None, max_batch_size: int | None,
                   return_logprobs: bool) -> list[Completion]:
    """One turn's completions for every active episode: one generate call per chunk of `max_batch_size`."""
    seed, turn = turn_seeds
    chunk = max_batch_size or len(active)
    gens: list[Completion] = []
    for c, lo in enumerate(range(0, len(active), chunk)):
        rows: dict[str, Any] = {} if owner is None else {"members": [owner[id(e)] for e in active[lo : lo + chunk]]}
        gens += policy.generate(prompts[lo : lo + chunk], sampling, seed=turn_seed(seed, turn, c),
                                return_logprobs=return_logprobs, **rows)
    if len(gens) != len(active):
        raise RuntimeError(f"policy returned {len(gens)} generations for {len(active)} prompts")
    return gens


def _step_envs(active: list[_Episode], prompts: list[str], gens: list[Completion], max_turns: int | None,
               max_episode_tokens: int | None, step_workers: int) -> None:
    """Each env steps on its completion; tool envs (`concurrent_steps`) in threads, so a slow call waits alone."""
    steps = list(zip(active, prompts, gens))
    if step_workers > 1 and len(steps) > 1 and getattr(active[0].env.unwrapped, "concurrent_steps", False):
        with ThreadPoolExecutor(min(step_workers, len(steps))) as pool:
            list(pool.map(lambda x: x[0].step(x[1], x[2], max_turns, max_episode_tokens), steps))
    else:
        for episode, prompt, gen in steps:
            episode.step(prompt, gen, max_turns, max_episode_tokens)
