"""A run's rollouts and held-out evaluation: the `RolloutSpec` resolved once from the config, and evals."""

from __future__ import annotations

from collections.abc import Callable

from esopt.engines.base import Engine
from esopt.rollout import RolloutSpec, env_examples, summarize, trajectory_score
from esopt.train.config import BaseTrainConfig
from esopt.train.tasks import heldout_task_seeds


def rollout_spec(config: BaseTrainConfig, make_env: Callable) -> RolloutSpec:
    """The run's sampling, conversation mode, system prompt, worked examples and budgets (examples are
    built once here, from one env, and shared by every episode of the run)."""
    examples: tuple = ()
    if config.env.few_shot:
        with make_env() as env:
            examples = tuple(env_examples(env, config.env.few_shot))
    return RolloutSpec(sampling=config.sampling.params(), conversation=config.env.conversation,
                       system_prompt=config.env.system_prompt, examples=examples,
                       max_batch_size=config.max_batch_size, max_prompt_tokens=config.env.max_prompt_tokens,
                       max_episode_tokens=config.env.max_episode_tokens)


def evaluate(policy: Engine, config: BaseTrainConfig, spec: RolloutSpec, make_env: Callable,
             seed_offset: int = 0) -> dict:
    """The unperturbed policy on the held-out tasks, `repeats` rollouts each, with the run's sampling."""
    seeds = heldout_task_seeds(config) * config.eval.repeats
    trajectories, stats = spec.run(policy, make_env, seeds, seed=config.eval.seed + seed_offset)
    out: dict = summarize(trajectories)
    out["tokens_per_second"] = stats.tokens_per_second
    out["eval_seconds"] = stats.seconds
    # per-episode scores (same tasks and sampling seeds at every eval): paired before/after comparisons
    out["episode_success"] = [int(t.success) for t in trajectories]
    out["episode_shaped"] = [round(trajectory_score(t, "shaped"), 4) for t in trajectories]
    return out
