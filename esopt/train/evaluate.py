"""A run's rollouts and held-out evaluation: the `RolloutSpec` resolved once from the config, and evals."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from esopt.engines.base import Engine
from esopt.rollout import RolloutSpec, env_examples, summarize, trajectory_score
from esopt.train.config import BaseTrainConfig, ESTrainConfig
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


def member_spec(spec: RolloutSpec, config: ESTrainConfig) -> RolloutSpec:
    """The spec ES members roll out with: the run's, at `es.temperature` when set (evals keep the run's)."""
    if config.es.temperature is None:
        return spec
    return spec.replace(sampling=dataclasses.replace(spec.sampling, temperature=config.es.temperature))


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
    labels = episode_labels(trajectories)
    if labels:
        out["episode_labels"] = labels
    return out


# What an env's last info may say about the kind of task an episode was: `analyze gain --by KEY` breaks
# success down by it (MiniWoB: `task`; Web-v0: `template`, `tier`, `eval_types`).
LABEL_KEYS = ("task", "template", "tier", "eval_types")


def curve_config(config: BaseTrainConfig) -> BaseTrainConfig | None:
    """The config of the learning-curve evals (`eval.curve_every`): `curve_tasks` validation tasks, one rollout
    each, the run's sampling; None when they are off."""
    if not config.eval.curve_every:
        return None
    curve = config.eval.model_copy(update={"split": "validation", "tasks": config.eval.curve_tasks, "repeats": 1})
    return config.model_copy(update={"eval": curve})


def episode_labels(trajectories) -> dict[str, list[str]]:
    """{key: one label per episode} for each of LABEL_KEYS that the last turn's info of some episode carries."""
    last = [t.turns[-1].info if t.turns else {} for t in trajectories]
    return {key: [str(info.get(key, "")) for info in last] for key in LABEL_KEYS if any(key in i for i in last)}


def base_eval_key(config: BaseTrainConfig) -> str:
    """What the starting model's eval depends on: the model, env, sampling and held-out set, the batch layout,
    and the kernels (torch version, CPU, threads: greedy decoding flips on near-ties between kernels)."""
    import torch

    from esopt.utils.report import cpu_model

    what = {"model": config.model.model_dump(), "env": config.env.model_dump(),
            "sampling": config.sampling.model_dump(), "max_batch_size": config.max_batch_size,
            "eval": config.eval.model_dump(exclude={"every", "base_cache", "curve_every", "curve_tasks"}),
            "torch": torch.__version__, "cpu": cpu_model(), "threads": torch.get_num_threads()}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:20]


def cached_base_eval(config: BaseTrainConfig, compute: Callable[[], dict]) -> dict:
    """`compute()` (the eval of the starting model), or its cached result from `config.eval.base_cache` when a
    run with the same `base_eval_key` already computed it (a sweep's runs at one setting share one base)."""
    if config.eval.base_cache is None:
        return compute()
    from esopt.utils.io import write_json_atomic

    path = Path(config.eval.base_cache) / f"{base_eval_key(config)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    # runs of a sweep started side by side: the first computes, the others wait for its file (not a second eval)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return json.loads(path.read_text())
        result = compute()
        write_json_atomic(path, result)
        return result
