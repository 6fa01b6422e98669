"""`ESTrainer`: ES fine-tuning with TRL's `GRPOTrainer` calling convention, for people who use TRL.

    from esopt import ESConfig, ESTrainer
    trainer = ESTrainer(model="smollm2", reward_funcs=[accuracy], train_dataset=ds,
                        args=ESConfig(output_dir="out", max_steps=50, population_size=16))
    trainer.train()

Swap `trl.GRPOTrainer`/`GRPOConfig` for these and the script runs ES: the reward functions, the dataset and the
names of the settings they share (learning_rate, max_completion_length, temperature, top_p, top_k, max_steps,
logging_steps, save_steps, output_dir, seed, reward_weights, report_to) carry over. Where they differ:
learning_rate is ES's step alpha; max_completion_length counts one reply (TRL: the whole tool-using
completion); logging_steps and save_steps are whole generations (TRL also takes fractions of the run). What differs is
what ES needs (population_size, sigma and its schedule, noise, batched) and what it does not (no backward pass,
no optimizer state, no reference model: one generation is G perturbed members, each scored on the same prompts).
A GRPOConfig name with no ES meaning (num_generations, beta, ...) is refused with what to use instead.

Multi-turn tool use: `ESTrainer(..., environment_factory=Cls)` takes the environment classes TRL's GRPOTrainer
takes (`reset(**row)`, public methods as tools, optional `get_reward()`; `esopt.envs.environment`), with tool
calls in esopt's ReAct format so any model can make them; `max_tool_calling_iterations` caps the calls.

Reward functions are called as TRL calls them, `f(prompts=[p], completions=[c], **columns)`, one completion per
call; TRL's extra keywords `completion_ids`, `trainer_state`, `log_extra` and `log_metric` are not passed, so
write them with `**kwargs` (as TRL's docs advise).

Under it is the same ES and the same run dir as `esopt train`: `history.jsonl` (the ledger: the weights rebuild
exactly from the base model and it), checkpoints loadable with `AutoModelForCausalLM.from_pretrained`,
`metrics.jsonl`, TensorBoard logs (`tb/`) and, with `report_to="trackio"`, a local trackio run. The dataset and
the reward functions are Python objects, so the env they make is registered in this process only
(`esopt-local/...`): resume a run with `ESTrainer(...same arguments...).train(resume_from_checkpoint=True)`.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import gymnasium
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from esopt.envs.base import AgentEnv
from esopt.envs.dataset import PromptDatasetEnv, RewardFunc, check_rows
from esopt.envs.environment import EnvironmentToolEnv
from esopt.train.config import BaseTrainConfig, ConfigError, ESTrainConfig, _one_line, build_config
from esopt.train.tasks import heldout_task_seeds

_ENV_IDS = itertools.count()


# GRPOConfig settings with no ES meaning, and what to use instead
GRPO_ONLY = {
    "num_generations": "ES scores population_size perturbed members, each on the same prompts_per_member prompts",
    "per_device_train_batch_size": "one generation rolls out population_size x prompts_per_member completions",
    "gradient_accumulation_steps": "ES takes no gradient; a bigger population_size averages more members",
    "beta": "ES has no KL term and no reference model",
    "epsilon": "ES has no importance ratio to clip",
    "num_iterations": "each generation's completions are used once, by the update they score",
    "loss_type": "ES has no loss; shaping sets how rewards weigh the members' noise",
    "scale_rewards": "rewards are shaped across the population (shaping: zscore, centered_rank, identity)",
    "use_vllm": "ES generates with esopt's engines (batched=True rolls out all members in one batch)",
    "gradient_checkpointing": "ES runs no backward pass",
    "trackio_space_id": "trackio logs stay on this machine (no network at run time): `trackio show` views them",
}


class ESConfig(BaseModel):
    """The trainer's arguments: GRPOConfig's names where they mean the same, ES's own after them. (The strategy's
    own validated settings are `esopt.es.ESConfig`; this builds them.)"""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # --- shared with GRPOConfig ----------------------------------------------------------------------------
    output_dir: str = Field("trainer_output", description="the run dir (ledger, checkpoints, metrics, tb/)")
    learning_rate: float = Field(5e-4, ge=0, description="ES step size alpha: theta += alpha/G sum_i z_i eps_i")
    max_steps: int = Field(100, ge=1, description="generations (one update each)")
    max_completion_length: int = Field(256, ge=1, description="new tokens per reply (per turn with tools; TRL: "
                                       "per whole tool-using completion)")
    temperature: float = Field(1.0, ge=0, description="sampling temperature of rollouts and evals (0: greedy)")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0: no top-k filter")
    logging_steps: int = Field(1, ge=1, description="print a log line every k generations")
    save_steps: int = Field(10, ge=1, description="checkpoint every k generations (and at the end)")
    save_total_limit: int = Field(2, ge=1, description="checkpoints kept")
    eval_steps: int = Field(0, ge=0, description="evaluate on eval_dataset every k generations (0: before and after)")
    seed: int = 0
    reward_weights: list[float] | None = Field(None, description="one weight per reward function (default 1 each)")
    report_to: Literal["tensorboard", "trackio", "none"] | list[Literal["tensorboard", "trackio"]] = Field(
        "tensorboard", description="tensorboard: tb/ in the run dir; trackio: a local trackio run (needs trackio); "
                                   "none or []: metrics.jsonl only (always written)")
    project: str = Field("huggingface", min_length=1, description="the trackio project (report_to trackio)")
    bf16: bool = Field(False, description="bfloat16 weights (pays only on hardware with native bf16)")
    # --- ES's own ------------------------------------------------------------------------------------------
    population_size: int = Field(16, ge=2, description="G: perturbed members per generation")
    prompts_per_member: int = Field(8, ge=1, description="E: every member completes the same E prompts")
    sigma: float = Field(4e-3, gt=0, description="noise scale at generation 0")
    sigma_min: float = Field(2e-3, ge=0, description="sigma's floor at the end of the cosine schedule")
    sigma_schedule: Literal["cosine", "linear", "constant"] = "cosine"
    antithetic: bool = Field(True, description="members in mirrored pairs (+eps, -eps)")
    noise: str = Field("normal", description="normal (dense Gaussian), lowrank (EGGROLL), subspace (LoRA-shaped)")
    noise_rank: int = Field(1, ge=1, description="lowrank, subspace: rank of each member's noise")
    batched: bool = Field(False, description="all members' completions in one batch (lowrank noise)")
    shaping: Literal["zscore", "centered_rank", "identity"] = "zscore"
    optimizer: Literal["sgd", "adam"] = "sgd"
    success_threshold: float = Field(1.0, description="a completion whose reward reaches this counts as solved")
    max_eval_samples: int | None = Field(None, ge=1, description="eval on the first k eval rows (default: all)")
    max_batch_size: int | None = Field(None, ge=1, description="cap on completions per generate call")
    max_tool_calling_iterations: int | None = Field(
        None, ge=0, description="environment_factory: tool calls per episode before it is cut off (None: 5; "
                                "TRL: no limit)")
    device: str = Field("cpu", description="cpu, auto, cuda, cuda:N")

    def __init__(self, **data: Any) -> None:
        for name, hint in GRPO_ONLY.items():
            if name in data:
                raise ConfigError(f"ESConfig: {name} is GRPOConfig's, not ES's: {hint}")
        try:
            super().__init__(**data)
        except ValidationError as e:
            raise ConfigError(_one_line(e).replace("config error:", "ESConfig:", 1)) from None

    @model_validator(mode="after")
    def _pairs(self) -> ESConfig:
        if self.antithetic and self.population_size % 2:
            raise ValueError(f"population_size {self.population_size} must be even with antithetic pairs")
        return self


def _row_dicts(dataset: Any, what: str) -> list[dict[str, Any]]:
    """A `datasets.Dataset` (or any sequence of dicts) as a list of row dicts."""
    if dataset is None:
        raise ValueError(f"{what} is required")
    try:
        rows = [dict(r) for r in dataset]
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a datasets.Dataset or a sequence of dicts, got "
                         f"{type(dataset).__name__}") from None
    check_rows(rows, what)
    return rows


def _model_name(model: Any, tokenizer: Any, out: Path) -> str:
    """The run's base model as `model.name` takes it: a name or a path as given; a model object is saved once
    under the run dir with its tokenizer (its weights are what the ledger replays from)."""
    if isinstance(model, (str, Path)):
        return str(model)
    if not hasattr(model, "save_pretrained"):
        raise ValueError(f"model must be a model name, a local directory or a transformers model, got "
                         f"{type(model).__name__}")
    if tokenizer is None:
        raise ValueError("a model object needs its tokenizer: ESTrainer(model, ..., processing_class=tokenizer)")
    path = (out / "base_model").resolve()  # absolute: a resume or replay from elsewhere finds it
    if not (path / "config.json").exists():
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return str(path)


def dataset_config(data: dict[str, Any], train_rows: list[dict[str, Any]], eval_rows: list[dict[str, Any]],
                   reward_funcs: Sequence[RewardFunc], reward_weights: Sequence[float] | None = None,
                   success_threshold: float = 1.0, environment_factory: Callable[[], Any] | None = None,
                   max_tool_calls: int | None = None) -> BaseTrainConfig:
    """A validated training config of any algorithm (`data`, without `env`) whose env is these dataset rows
    scored by these reward functions, registered in this process (`esopt-local/...`): one turn each, or with an
    `environment_factory` (TRL's contract, `esopt.envs.environment`) a multi-turn tool-using episode. Without
    eval rows, evals run on 8 training rows (a smoke signal, not a held-out number)."""
    env_id = f"esopt-local/PromptDataset-{next(_ENV_IDS)}-v0"
    evals = {"tasks": len(eval_rows) or min(8, len(train_rows)), "split": "test", "base_cache": None}
    multi_turn = {"conversation": "history"} if environment_factory is not None else {}
    config = build_config({**data, "env": {"id": env_id, "kwargs": {}, "few_shot": 0, **multi_turn},
                           "eval": {**data.get("eval", {}), **evals}})
    # each eval seed names one eval row, so an eval visits every row once
    heldout = {s: i for i, s in enumerate(heldout_task_seeds(config))} if eval_rows else {}
    turns = (5 if max_tool_calls is None else max_tool_calls) + 1  # the calls, then the answer

    def make(**_: Any) -> AgentEnv:
        if environment_factory is not None:
            return EnvironmentToolEnv(environment_factory, train_rows, reward_funcs, reward_weights, eval_rows,
                                      heldout, success_threshold, max_turns=turns)
        return PromptDatasetEnv(train_rows, reward_funcs, reward_weights, eval_rows, heldout, success_threshold)

    make()  # rows, reward weights and an environment's tools are checked here, with a clear error, not in a worker

    gymnasium.register(env_id, entry_point=make)
    return config


class ESTrainer:
    """ES over a prompt dataset and reward functions; `train()` runs it and returns the run's summary."""

    def __init__(self, model: Any, reward_funcs: RewardFunc | Sequence[RewardFunc] | None, train_dataset: Any,
                 eval_dataset: Any = None, args: ESConfig | None = None, processing_class: Any = None,
                 environment_factory: Callable[[], Any] | None = None) -> None:
        self.args = args or ESConfig()
        self.environment_factory = environment_factory
        funcs = [] if reward_funcs is None else [reward_funcs] if callable(reward_funcs) else list(reward_funcs)
        if environment_factory is not None and not callable(environment_factory):
            raise ValueError("environment_factory must be a class or a callable that makes one environment")
        for f in funcs:
            if hasattr(f, "parameters") and hasattr(f, "forward"):
                raise ValueError(f"reward function {type(f).__name__} is a model: ESTrainer takes reward functions "
                                 "only (score with the model inside a function)")
            if inspect.iscoroutinefunction(f):
                raise ValueError(f"reward function {getattr(f, '__name__', f)} is async: ESTrainer calls reward "
                                 "functions synchronously")
        if (not funcs and environment_factory is None) or not all(callable(f) for f in funcs):
            raise ValueError("reward_funcs must be a callable or a list of callables (TRL's reward function "
                             "signature: f(prompts, completions, **columns) -> list[float | None])")
        self.reward_funcs = funcs
        self.train_rows = _row_dicts(train_dataset, "train_dataset")
        self.eval_rows = _row_dicts(eval_dataset, "eval_dataset") if eval_dataset is not None else []
        if self.args.max_eval_samples:
            self.eval_rows = self.eval_rows[: self.args.max_eval_samples]
        self.output_dir = Path(self.args.output_dir)
        self.config = self._config(_model_name(model, processing_class, self.output_dir))

    def _config(self, model_name: str) -> ESTrainConfig:
        a = self.args
        reporting = [a.report_to] if isinstance(a.report_to, str) else a.report_to  # [] reports nowhere, as in TRL
        data = {
            "algo": "es", "seed": a.seed, "steps": a.max_steps, "checkpoint_every": a.save_steps,
            "keep_checkpoints": a.save_total_limit, "max_batch_size": a.max_batch_size,
            "measure_inference_peak": False, "log_every": a.logging_steps, "tensorboard": "tensorboard" in reporting,
            "trackio_project": a.project if "trackio" in reporting else None,
            "model": {"name": model_name, "dtype": "bfloat16" if a.bf16 else "float32", "device": a.device},
            "sampling": {"temperature": a.temperature, "top_p": a.top_p, "top_k": a.top_k,
                         "max_new_tokens": a.max_completion_length},
            "eval": {"every": a.eval_steps},
            "es": {"population_size": a.population_size, "antithetic": a.antithetic, "sigma": a.sigma,
                   "sigma_min": a.sigma_min, "sigma_schedule": a.sigma_schedule, "alpha": a.learning_rate,
                   "shaping": a.shaping, "optimizer": a.optimizer, "noise": a.noise, "noise_rank": a.noise_rank,
                   "batched": a.batched, "tasks_per_member": a.prompts_per_member, "reward": "env"},
        }
        try:
            config = dataset_config(data, self.train_rows, self.eval_rows, self.reward_funcs, a.reward_weights,
                                    a.success_threshold, self.environment_factory, a.max_tool_calling_iterations)
        except ConfigError as e:
            raise ConfigError(str(e).replace("config error:", "ESConfig:", 1)) from None
        assert isinstance(config, ESTrainConfig)
        return config

    def train(self, resume_from_checkpoint: bool = False, progress: bool = True) -> dict:
        """Run (or, with resume_from_checkpoint, continue) the run in `args.output_dir`; returns its summary."""
        from esopt.train.es import train
        from esopt.train.rundir import RunDir

        resume = bool(resume_from_checkpoint)
        if not resume and RunDir(self.output_dir, create=False).holds_run():
            raise FileExistsError(f"{self.output_dir} already holds a run: train(resume_from_checkpoint=True) "
                                  "continues it, or choose another output_dir")
        return train(self.config, self.output_dir, resume=resume, progress=progress)


__all__ = ["ESConfig", "ESTrainer"]
