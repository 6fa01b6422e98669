"""Chat prompts of an episode: the system prompt, worked examples as chat turns, the observation."""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym

from esopt.engines.base import Engine

Message = dict[str, str]
Examples = Sequence[tuple[str, str]]  # worked (observation, action) exchanges shown before the episode


def resolve_system_prompt(env: gym.Env, system_prompt: str | None) -> str | None:
    """The explicit system prompt, else the env's `instructions` (None if it has none)."""
    if system_prompt is not None:
        return system_prompt
    return getattr(env.unwrapped, "instructions", None)


def markov_messages(system_prompt: str | None, obs: str, examples: Examples = ()) -> list[Message]:
    """[system, (user(example obs), assistant(example action))..., user(obs)]; the system message is left
    out when there is no (or an empty) prompt."""
    messages: list[Message] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for example_obs, example_action in examples:
        messages += [{"role": "user", "content": example_obs}, {"role": "assistant", "content": example_action}]
    messages.append({"role": "user", "content": obs})
    return messages


def build_markov_prompt(policy: Engine, system_prompt: str | None, obs: str, examples: Examples = ()) -> str:
    """The exact prompt the engine builds in markov mode (reuse it for supervised targets)."""
    return policy.build_prompt(markov_messages(system_prompt, obs, examples))


def env_examples(env: gym.Env, count: int) -> list[tuple[str, str]]:
    """`count` worked (observation, action) exchanges from the env's `worked_examples`, for few-shot prompts."""
    if count <= 0:
        return []
    make = getattr(env.unwrapped, "worked_examples", None)
    if make is None:
        raise ValueError(f"{env.spec.id if env.spec else type(env).__name__} has no worked_examples(): "
                         "few-shot prompting needs them (set few_shot to 0)")
    return [(str(o), str(a)) for o, a in make(count)]


def count_tokens(policy: Engine, text: str) -> int:
    return len(policy.tokenizer(text, add_special_tokens=False)["input_ids"])
