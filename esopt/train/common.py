"""What every trainer (ES, GRPO, PPO) shares: model and env construction, task seeds, held-out
evaluation, the run directory (config, metrics, TensorBoard, plots, checkpoints) and peak memory.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from esopt.policies import MODEL_RECIPES, HFPolicy, load_policy
from esopt.policies.base import SamplingParams
from esopt.rollout import Trajectory, env_examples, run_episodes
from esopt.train.config import BaseTrainConfig, ModelSection, dump_config
from esopt.utils.io import save_pretrained_atomic, write_json_atomic
from esopt.utils.progress import progress_bar, say  # noqa: F401  (re-exported for the trainers)

# Training and held-out task seeds come from disjoint ranges, so no held-out seed is ever trained on.
TRAIN_SEED_RANGE = (0, 2**31)
HELDOUT_SEED_BASE = 2**31


# --- model and env --------------------------------------------------------------------------------

def load_model(section: ModelSection, env_kwargs: dict | None = None) -> HFPolicy:
    """The run's model through the one factory (`load_policy`); a recipe model ('tiny-sudoku') gets the
    env's board size and its warm-start steps."""
    options = {}
    if section.name in MODEL_RECIPES:
        options = {"size": int((env_kwargs or {}).get("size", 4)), "steps": section.warm_start_steps}
    return load_policy(section.name, dtype=section.resolved_dtype, device=section.device, seed=section.seed,
                       **options)


def env_factory(config: BaseTrainConfig) -> Callable:
    from esopt.envs import make_env

    env_id, kwargs = config.env.id, dict(config.env.kwargs)
    make_env(env_id, **kwargs).close()  # fail fast, with the env's own message, on bad kwargs
    return lambda: make_env(env_id, **kwargs)


def train_task_seeds(seed: int, step: int, count: int) -> list[int]:
    rng = np.random.default_rng([seed, step, 7])
    return [int(s) for s in rng.integers(*TRAIN_SEED_RANGE, size=count)]


def task_pool_seeds(seed: int, count: int) -> list[int]:
    """A fixed training pool (es.task_set=fixed): drawn once from the training range, reused every generation."""
    rng = np.random.default_rng([seed, 7, 2**20])
    return [int(s) for s in rng.integers(*TRAIN_SEED_RANGE, size=count)]


def heldout_task_seeds(config: BaseTrainConfig) -> list[int]:
    """Held-out tasks of `config.eval.split`: test seeds lie in [2^31, 2^31 + 2^30), validation seeds in
    [2^31 + 2^30, 2^32), training seeds below 2^31, so the three never share a seed."""
    rng = np.random.default_rng([config.eval.seed, 11])
    base = HELDOUT_SEED_BASE + (2**30 if config.eval.split == "validation" else 0)
    return [base + int(s) for s in rng.integers(0, 2**30, size=config.eval.tasks)]


def trajectory_score(t: Trajectory, kind: str) -> float:
    """One episode's scalar: the env reward, binary success, or the env's shaped reward."""
    if kind == "success":
        return float(t.success)
    if kind == "shaped":
        return float(t.turns[-1].info.get("shaped_reward", 0.0)) if t.turns else 0.0
    return float(t.reward)


def summarize(trajectories: list[Trajectory]) -> dict[str, float]:
    """Episode means; `correct_given_valid` pools turns: correct actions / valid actions (format-only
    gains raise the valid-action rate without it)."""
    n = max(len(trajectories), 1)
    turns = [turn for t in trajectories for turn in t.turns]
    valid = sum(bool(turn.info.get("action_is_valid", False)) for turn in turns)
    correct = sum(bool(turn.info.get("action_is_correct", False)) for turn in turns)
    return {
        "success_rate": sum(t.success for t in trajectories) / n,
        "mean_reward": sum(t.reward for t in trajectories) / n,
        "mean_turns": sum(t.num_turns for t in trajectories) / n,
        "valid_action_rate": sum(t.valid_action_rate for t in trajectories) / n,
        "correct_given_valid": correct / valid if valid else 0.0,
        "shaped_reward": sum(t.turns[-1].info.get("shaped_reward", 0.0) if t.turns else 0.0 for t in trajectories) / n,
    }


def few_shot_examples(config: BaseTrainConfig, make: Callable) -> list[tuple[str, str]]:
    """The env's `config.env.few_shot` worked exchanges (the same for every episode of the run)."""
    if not config.env.few_shot:
        return []
    env = make()
    try:
        return env_examples(env, config.env.few_shot)
    finally:
        env.close()


def rollout(policy: HFPolicy, config: BaseTrainConfig, make: Callable, task_seeds: list[int], seed: int,
            sampling: SamplingParams | None = None, on_batch: Callable | None = None,
            system_prompt: str | None = None):
    """run_episodes with the run's sampling (unless given), conversation mode, system prompt, worked
    examples and batch cap."""
    return run_episodes(policy, make, task_seeds, sampling or config.sampling.params(), seed=seed,
                        conversation=config.env.conversation,
                        system_prompt=config.env.system_prompt if system_prompt is None else system_prompt,
                        max_batch_size=config.max_batch_size, examples=few_shot_examples(config, make),
                        max_prompt_tokens=config.env.max_prompt_tokens, on_batch=on_batch,
                        max_episode_tokens=config.env.max_episode_tokens)


def evaluate(policy: HFPolicy, config: BaseTrainConfig, make: Callable, seed_offset: int = 0) -> dict:
    """The unperturbed policy on the held-out tasks, `repeats` rollouts each, with the run's sampling."""
    seeds = heldout_task_seeds(config) * config.eval.repeats
    trajectories, stats = rollout(policy, config, make, seeds, seed=config.eval.seed + seed_offset)
    out: dict = summarize(trajectories)
    out["tokens_per_second"] = stats.tokens_per_second
    out["eval_seconds"] = stats.seconds
    # per-episode scores (same tasks and sampling seeds at every eval): paired before/after comparisons
    out["episode_success"] = [int(t.success) for t in trajectories]
    out["episode_shaped"] = [round(trajectory_score(t, "shaped"), 4) for t in trajectories]
    return out


# --- run directory --------------------------------------------------------------------------------

class RunDir:
    """config.yaml, history.jsonl, metrics.jsonl, tb/, plots/, checkpoints/, final/ under one root."""

    def __init__(self, root: str | Path, create: bool = True):
        self.root = Path(root)
        if create:
            self.create()
        self.config_path = self.root / "config.yaml"
        self.history_path = self.root / "history.jsonl"
        self.metrics_path = self.root / "metrics.jsonl"
        self.checkpoints = self.root / "checkpoints"
        self.plots = self.root / "plots"
        self._tb = None

    def create(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def holds_run(self) -> bool:
        """A run was started here (a ledger or metrics rows exist)."""
        return any(p.exists() and p.stat().st_size for p in (self.history_path, self.metrics_path))

    def write_config(self, config: BaseTrainConfig) -> None:
        dump_config(config, self.config_path)

    @property
    def tb(self):
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.root / "tb"))
        return self._tb

    def log(self, step: int, kind: str, values: dict) -> None:
        row = {"step": step, "kind": kind, "time": time.time(), **values}
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        for k, v in values.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.tb.add_scalar(f"{kind}/{k}", v, step)
        self.tb.flush()

    def metrics(self) -> list[dict]:
        if not self.metrics_path.exists():
            return []
        rows = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line after a kill
        return rows

    def drop_metrics_from(self, step: int) -> None:
        """On resume, forget rows of steps that will be redone."""
        keep = [r for r in self.metrics() if r["step"] <= step]
        from esopt.utils.io import write_text_atomic

        write_text_atomic(self.metrics_path, "".join(json.dumps(r) + "\n" for r in keep))

    def save_checkpoint(self, policy: HFPolicy, step: int, state: dict, keep: int,
                        extra_files: dict | None = None) -> Path:
        """Atomic HF checkpoint + trainer_state.json (+ extra files, e.g. optimizer state)."""
        files = {**(extra_files or {}), "trainer_state.json": json.dumps({"step": step, **state})}
        out = save_pretrained_atomic(policy.model, policy.tokenizer, self.checkpoints / f"step_{step:06d}",
                                     extra_files=files)
        for old in sorted(self.checkpoints.glob("step_*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        return out

    def latest_checkpoint(self, at_most: int | None = None) -> tuple[int, Path] | None:
        found = []
        for d in self.checkpoints.glob("step_*"):
            state = d / "trainer_state.json"
            if state.exists():
                step = json.loads(state.read_text())["step"]
                if at_most is None or step <= at_most:
                    found.append((step, d))
        return max(found) if found else None

    @property
    def summary_path(self) -> Path:
        return self.root / "summary.json"

    def save_final(self, policy: HFPolicy, summary: dict, extra_files: dict | None = None) -> None:
        save_pretrained_atomic(policy.model, policy.tokenizer, self.root / "final", extra_files=extra_files)
        write_json_atomic(self.summary_path, summary)

    def plot(self) -> list[Path]:
        from esopt.utils.plots import plot_run

        return plot_run(self.metrics(), self.plots)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


# --- progress and summary --------------------------------------------------------------------

@dataclass
class Timers:
    """Wall-clock split of ES work: perturb/restore/update (ES overhead) vs rollouts."""

    perturb: float = 0.0
    restore: float = 0.0
    rollout: float = 0.0
    update: float = 0.0
    eval: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def es_overhead_share(self) -> float:
        """Share of (perturb + restore + update) in (those + rollouts); the ES overhead goal is <= 10%."""
        es = self.perturb + self.restore + self.update
        return es / max(es + self.rollout, 1e-9)


def read_summary(rd: RunDir) -> dict | None:
    try:
        return json.loads(rd.summary_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


# --- memory ---------------------------------------------------------------------------------------

def inference_peak_bytes(config: BaseTrainConfig, episodes: int) -> int | None:
    """Peak memory of inference alone (same model, same batch, same imports) in a fresh process."""
    cmd = [sys.executable, "-m", "esopt.train.memprobe", json.dumps(config.model_dump(mode="json")), str(episodes)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True)
        return int(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as e:
        print(f"warning: inference-only memory probe failed: {e}", file=sys.stderr)
        return None
