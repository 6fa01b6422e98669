"""Typed, validated run configuration: one config class per trainer on a shared base (TRL style).

A YAML file names its algorithm (`algo: es | grpo | ppo`); every field can be overridden from the
command line with dotted `key=value` pairs (`es.sigma=2e-3 env.kwargs.h_star=10`). Any mistake is
reported as one line naming the field, e.g. `config error: es.sigma: must be > 0 (got -1)`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from esopt.engines.base import SamplingParams
from esopt.es.config import ESConfig
from esopt.utils.io import write_text_atomic

ScoreKind = Literal["env", "success", "shaped"]  # how an episode becomes one scalar (`trajectory_score`)


class ConfigError(ValueError):
    """A bad config, reported in one line."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def check_device(v: str) -> str:
    """A device spec as the model section takes it (the variance analysis takes the same)."""
    if not re.fullmatch(r"cpu|auto|mps|cuda(:\d+)?|xpu(:\d+)?", v):
        raise ValueError("must be cpu, auto, cuda, cuda:N, mps or xpu")
    return v


class ModelSection(Section):
    @property
    def resolved_dtype(self) -> str:
        from esopt.models import model_dtype

        return model_dtype(self.name, self.dtype, self.device)

    name: str = Field(
        "tiny", description="'tiny', 'tiny-sudoku' (warm-started, cached), 'smollm2', a local HF dir or .gguf"
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="auto: bfloat16 for smollm2 on a GPU or a CPU with native bf16, else float32")
    device: str = Field("cpu", description="cpu, auto (cuda if available), cuda, cuda:N, mps or xpu")
    engine: str = Field("hf", description="inference engine by registered name (esopt.engines.ENGINES)")
    seed: int = Field(0, description="init seed of a fresh tiny model (and of the warm start)")
    warm_start_steps: int = Field(800, ge=1, description="supervised steps of the 'tiny-sudoku' warm start")

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        return check_device(v)


class EnvSection(Section):
    id: str = "esopt/Sudoku-v0"
    kwargs: dict[str, Any] = Field(default_factory=lambda: {"size": 4, "h_star": 10})
    conversation: Literal["markov", "history"] = "markov"
    system_prompt: str | None = Field(None, description="None: the env's own instructions")
    few_shot: int = Field(
        0, ge=0, description="worked (observation, action) exchanges from the env shown as chat turns")
    max_prompt_tokens: int | None = Field(
        None, ge=1, description="history mode: context budget; the oldest exchanges are dropped to fit it")
    max_episode_tokens: int | None = Field(
        None, ge=1, description="token budget: an episode is truncated once it has generated this many tokens")


class SamplingSection(Section):
    temperature: float = Field(SamplingParams.temperature, ge=0)
    top_p: float = Field(SamplingParams.top_p, gt=0, le=1)
    top_k: int = Field(SamplingParams.top_k, ge=0)
    max_new_tokens: int = Field(64, ge=1)
    stop: list[str] = Field(default_factory=list, description="stop strings (ReAct: ['Observation:'])")

    def params(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.top_k, self.max_new_tokens, tuple(self.stop))


class EvalSection(Section):
    every: int = Field(5, ge=0, description="evaluate every k generations/steps (0: only before and after)")
    tasks: int = Field(64, ge=1, description="held-out tasks")
    repeats: int = Field(1, ge=1, description="rollouts per held-out task")
    seed: int = Field(1_000_003, description="seed of the held-out task set (disjoint stream from training)")
    split: Literal["test", "validation"] = Field(
        "test", description="held-out split: tune on 'validation', report on 'test' (disjoint seed ranges)")
    base_cache: str | None = Field(
        None, description="folder caching the starting model's eval by everything that determines it (model, env, "
                          "sampling, eval tasks, batch size, torch, CPU, threads): runs that share a base reuse it")
    curve_every: int = Field(
        0, ge=0, description="every k steps (and before the first), success on `curve_tasks` validation tasks: the "
                             "learning curve (0: off); the held-out evals above are unchanged")
    curve_tasks: int = Field(32, ge=1, description="validation tasks of each learning-curve eval")


class BaseTrainConfig(Section):
    algo: str
    seed: int = 0
    steps: int = Field(100, ge=1, description="generations (ES) or optimisation steps (GRPO/PPO)")
    model: ModelSection = Field(default_factory=ModelSection)
    env: EnvSection = Field(default_factory=EnvSection)
    sampling: SamplingSection = Field(default_factory=SamplingSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    max_batch_size: int | None = Field(None, ge=1, description="cap on episodes per generate call")
    checkpoint_every: int = Field(10, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    measure_inference_peak: bool = Field(True, description="probe inference-only peak memory for the ratio")
    log_every: int = Field(1, ge=1, description="print the step's log line every k steps (metrics: every step)")
    tensorboard: bool = Field(True, description="also log metrics to TensorBoard (tb/ in the run dir)")
    trackio_project: str | None = Field(
        None, description="also log metrics to trackio under this project, one trackio run per run dir (local "
                          "SQLite under TRACKIO_DIR, nothing leaves the machine; needs `pip install trackio`)")

    def with_resolved_dtype(self):
        """This config with model.dtype as "auto" resolves here, which a run dir records: auto is bf16 or fp32 by
        CPU type, and a resume or replay on another machine must compute in the dtype the run did (bf16 on a CPU
        without it is emulated: slower, not different)."""
        return self.model_copy(update={"model": self.model.model_copy(update={"dtype": self.model.resolved_dtype})})

    @property
    def episodes_per_step(self) -> int:
        """Episodes one step rolls out (each trainer's config says; the memory probe uses it)."""
        raise NotImplementedError(f"{type(self).__name__} must define episodes_per_step")

    @property
    def rollout_batch_size(self) -> int:
        """Episodes of the largest training rollout call (what the inference-only memory probe runs)."""
        return self.episodes_per_step


class ESSection(ESConfig):
    """The ES core's settings (`esopt.es.ESConfig`, validated there) plus how members are scored."""

    total_generations: int | None = Field(None, ge=1, description="schedule length (default: the run's steps)")
    seed: int | None = Field(None, description="member-seed stream (default: the run's seed)")
    tasks_per_member: int = Field(32, ge=1, description="E: every member runs the same E tasks")
    reward: ScoreKind = Field("env", description="member score: env reward, success, or info['shaped_reward']")
    temperature: float | None = Field(
        None, ge=0, description="members' sampling temperature (default: sampling.temperature; 0: greedy members, "
        "so a member's score depends on its weights and tasks alone); evals keep the run's sampling")
    task_set: Literal["fresh", "fixed"] = Field(
        "fresh",
        description="fresh: new training tasks every generation; fixed: a pool drawn once and reused (the paper)")
    task_pool: int | None = Field(None, ge=1, description="fixed: pool size (default tasks_per_member: every "
                                  "generation runs the whole pool; larger: E tasks sampled from it per generation)")
    fitness: Literal["mean", "task_zscore"] = Field(
        "mean", description="member fitness: mean episode score, or each task z-scored across members first "
        "(EGGROLL's per-task baseline); the shaping is applied after it")

    batched: bool = Field(False, description="roll out all members' episodes in one batch (G x E episodes per "
                          "generate call): lowrank noise adds each row's low-rank term; normal noise runs each row "
                          "on its member's perturbed copy (a copy per member: for GPUs, where one member's decode "
                          "is launch-bound)")
    members_per_rollout: int | None = Field(
        None, ge=1, description="batched: members rolled out together (default: all G). Each member holds its own "
        "prefix KV during its rollout, so fewer cut peak memory, at smaller decode batches")
    evaluator: str | None = Field(None, description="population evaluator by registered name (esopt.population); "
                                  "default: ray with distributed.backend ray, batched with es.batched, else local")

    @model_validator(mode="after")
    def _check_pool(self) -> ESSection:
        if self.task_pool is not None and self.task_pool < self.tasks_per_member:
            raise ValueError(f"task_pool ({self.task_pool}) must be >= tasks_per_member ({self.tasks_per_member})")
        if self.batched and self.noise in ("lowrank", "subspace") and self.noise_others != "frozen":
            raise ValueError(f"es.batched with es.noise: {self.noise} needs es.noise_others: frozen")
        if self.members_per_rollout is not None and not self.batched:
            raise ValueError("es.members_per_rollout needs es.batched: true (members run one by one otherwise)")
        return self


class DistributedSection(Section):
    """Where the population is evaluated: in this process, or on Ray actors (one model replica each)."""

    backend: Literal["local", "ray"] = "local"
    workers: int = Field(2, ge=1, description="ray: model replicas (actors)")
    address: str | None = Field(None, description="ray: null starts a local cluster (files in the run dir); "
                                "'auto' or 'ray://host:port' joins one")
    timeout_s: float = Field(900.0, gt=0, description="ray: a member call running longer is re-run elsewhere")
    gpus_per_worker: float = Field(0.0, ge=0, description="ray: GPUs each replica asks for (0 on CPU machines)")
    threads_per_worker: int = Field(1, ge=1, description="ray: torch threads per replica")


class PromptSection(Section):
    """Prompt-parameter co-evolution: every `every` generations, skills distilled from the generation's
    trajectories are proposed as a new prompt, kept only if it wins the gate (0: off)."""

    every: int = Field(0, ge=0, description="a prompt step after every k generations (0: parameters only)")
    reflector: Literal["policy", "http", "feedback"] = Field(
        "policy", description="policy: the unperturbed model itself; http: an OpenAI-compatible endpoint; "
        "feedback: no model, the env's most frequent feedback on failing turns")
    base_url: str | None = Field(None, description="http: e.g. http://127.0.0.1:8000/v1 (esopt serve)")
    model: str = "default"
    api_key_env: str | None = Field(None, description="http: environment variable holding the API key")
    timeout_s: float = Field(60.0, gt=0)
    retries: int = Field(2, ge=0)
    max_skills: int = Field(8, ge=1, description="lines in the skills document")
    episodes: int = Field(8, ge=1, description="trajectories of the generation shown to the reflector")
    gate_tasks: int = Field(16, ge=1, description="training tasks the gate scores both prompts on")
    margin: float = Field(0.0, ge=0, description="the candidate must beat the current prompt by more than this")
    max_new_tokens: int = Field(256, ge=1, description="policy reflector: reply length")

    @model_validator(mode="after")
    def _check_http(self) -> PromptSection:
        if self.every and self.reflector == "http" and not self.base_url:
            raise ValueError("prompt.reflector http needs prompt.base_url")
        return self


class ESTrainConfig(BaseTrainConfig):
    algo: Literal["es"] = "es"
    es: ESSection = Field(default_factory=ESSection)
    distributed: DistributedSection = Field(default_factory=DistributedSection)
    prompt: PromptSection = Field(default_factory=PromptSection)

    @model_validator(mode="after")
    def _check_distributed(self) -> ESTrainConfig:
        if self.distributed.backend == "ray" and self.prompt.every:
            raise ValueError("prompt co-evolution runs with the local or batched evaluator; Ray workers do not "
                             "take a changing prompt yet")
        if self.distributed.backend == "ray" and self.es.batched:
            raise ValueError("es.batched runs the population in one process; it cannot be combined with "
                             "distributed.backend: ray")
        return self

    @property
    def population_evaluator(self) -> str:
        if self.es.evaluator is not None:
            return self.es.evaluator
        return "ray" if self.distributed.backend == "ray" else "batched" if self.es.batched else "local"

    @property
    def episodes_per_step(self) -> int:
        return self.es.population_size * self.es.tasks_per_member

    @property
    def rollout_batch_size(self) -> int:
        if self.es.batched:  # every member's episodes in one batch, or those of members_per_rollout members
            return min(self.es.members_per_rollout or self.es.population_size, self.es.population_size) \
                * self.es.tasks_per_member
        return self.es.tasks_per_member  # members run one after another

    @property
    def es_config(self) -> ESSection:
        """The `es` section with the schedule length, seed and restore mode resolved: what `ES` runs with. A
        batched population never writes members into the weights, so "auto" keeps no fp32 master ("none")."""
        e = self.es
        restore = e.restore if e.restore != "auto" else "none" if self.population_evaluator == "batched" else "exact"
        return e.model_copy(update={"total_generations": e.total_generations or self.steps,
                                    "seed": self.seed if e.seed is None else e.seed, "restore": restore})


# --- policy-gradient baselines ---------------------------------------------------------------------

class PGSection(Section):
    """Hyper-parameters GRPO and PPO share (each trainer overrides some defaults)."""

    tasks_per_step: int = Field(128, ge=1, description="distinct training tasks per optimisation step")
    reward: ScoreKind = Field(
        "env", description="episode score: env reward, success, or info['shaped_reward'] (as ES's member score)")
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate of the policy")
    lr_schedule: Literal["constant", "linear"] = Field(
        "constant", description="learning rates over the run: constant, or linear decay to 0 at the end "
        "(transformers' default, which TRL's trainers use)")
    weight_decay: float = Field(0.0, ge=0)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = Field(1e-8, gt=0)
    max_grad_norm: float = Field(1.0, ge=0, description="clip the policy (and critic) gradient norm; 0: no clipping")
    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO ratio clip: ratio kept in [1-eps, 1+eps]")
    kl_beta: float = Field(1e-3, ge=0, description="k3 KL penalty to a frozen copy of the initial model; 0: none")
    epochs: int = Field(1, ge=1, description="passes over each step's samples")
    minibatch_size: int = Field(256, ge=1, description="(prompt, response) samples per optimizer step")
    micro_batch_size: int = Field(16, ge=1, description="samples per forward/backward (gradient accumulation)")
    loss_agg: Literal["token_mean", "seq_mean"] = Field(
        "token_mean",
        description="policy loss: mean over the minibatch's generated tokens, or mean of per-sample means")

    @model_validator(mode="after")
    def _check_pg(self) -> PGSection:
        if self.micro_batch_size > self.minibatch_size:
            raise ValueError(f"micro_batch_size ({self.micro_batch_size}) must not exceed minibatch_size "
                             f"({self.minibatch_size})")
        if not all(0 <= b < 1 for b in self.adam_betas):
            raise ValueError(f"adam_betas must lie in [0, 1) (got {list(self.adam_betas)})")
        return self


class GRPOSection(PGSection):
    tasks_per_step: int = Field(128, ge=1, description="distinct tasks per step (each rolled out group_size times)")
    group_size: int = Field(8, ge=2, description="rollouts per task; advantages are z-scores within a group")
    adv_eps: float = Field(1e-8, gt=0, description="added to the group std before dividing")


class GRPOTrainConfig(BaseTrainConfig):
    algo: Literal["grpo"] = "grpo"
    grpo: GRPOSection = Field(default_factory=GRPOSection)

    @property
    def episodes_per_step(self) -> int:
        """Episodes per step (what the inference-only memory probe rolls out)."""
        return self.grpo.tasks_per_step * self.grpo.group_size


class PPOSection(PGSection):
    tasks_per_step: int = Field(1024, ge=1, description="episodes per step (ES: 32 members x 32 tasks = 1024)")
    epochs: int = Field(4, ge=1, description="passes over each step's samples")
    kl_beta: float = Field(0.0, ge=0, description="k3 KL penalty to the initial model; 0 (default): no reference")
    gamma: float = Field(1.0, ge=0, le=1, description="discount per turn")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda")
    vf_coef: float = Field(0.5, ge=0, description="weight of the value loss")
    value_clip: float = Field(0.2, ge=0, description="clip of the value change around the old value; 0: unclipped")
    critic_lr: float = Field(1e-5, gt=0, description="AdamW learning rate of the critic")
    norm_adv: bool = Field(True, description="normalize advantages over the batch's turns")


class PPOTrainConfig(BaseTrainConfig):
    algo: Literal["ppo"] = "ppo"
    ppo: PPOSection = Field(default_factory=PPOSection)

    @property
    def episodes_per_step(self) -> int:
        """Episodes per step (what the inference-only memory probe rolls out)."""
        return self.ppo.tasks_per_step


# one config class per algorithm; the trainer of each is `esopt.train.TRAINERS[algo]`
CONFIG_CLASSES: dict[str, type[BaseTrainConfig]] = {"es": ESTrainConfig, "grpo": GRPOTrainConfig, "ppo": PPOTrainConfig}


def _set_dotted(data: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"config error: cannot set {key!r}: {p!r} is not a section")
        node = child
    node[parts[-1]] = value


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    out = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key or key.strip() != key:
            raise ConfigError(f"config error: override {item!r} must look like key=value (dotted keys for sections)")
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        out.append((key, value))
    return out


def _one_line(e: ValidationError) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"]) or "<root>"
    msg = err["msg"].removeprefix("Value error, ")
    shown = err.get("type") not in ("missing", "extra_forbidden") and not isinstance(err.get("input"), dict)
    got = f" (got {err['input']!r})" if shown else ""
    more = f" [+{len(e.errors()) - 1} more]" if len(e.errors()) > 1 else ""
    return f"config error: {loc}: {msg}{got}{more}"


def build_config(data: dict | None = None, overrides: list[str] | None = None) -> BaseTrainConfig:
    """Defaults <- file data <- overrides, merged key by key (so `env.kwargs.h_star=5` keeps `size`)."""
    data = dict(data or {})
    parsed = parse_overrides(overrides or [])
    algo = dict(parsed).get("algo", data.get("algo", "es"))
    if algo not in CONFIG_CLASSES:
        raise ConfigError(f"config error: algo: unknown algorithm {algo!r}; choose one of {sorted(CONFIG_CLASSES)}")
    cls = CONFIG_CLASSES[algo]
    defaults = cls().model_dump()
    env_id = dict(parsed).get("env.id", (data.get("env") or {}).get("id"))
    if env_id is not None and env_id != defaults["env"]["id"]:
        defaults["env"]["kwargs"] = {}  # the default kwargs are Sudoku's; another env starts from its own
    merged = _deep_merge(defaults, data)
    for key, value in parsed:
        _set_dotted(merged, key, value)
    try:
        return cls.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(_one_line(e)) from None


def _deep_merge(base: dict, update: dict) -> dict:
    out = dict(base)
    for k, v in update.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


SHIPPED_CONFIGS = Path(__file__).resolve().parents[1] / "configs"  # package data: works in any install


def shipped_configs() -> list[str]:
    return sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.yaml"))


def resolve_config_path(path: str | Path) -> Path:
    """A config file: the path itself if it exists, else a shipped config by name (`smoke`,
    `smoke.yaml` or `configs/smoke.yaml`, so the README's commands work outside a checkout too)."""
    path = Path(path)
    if path.exists():
        return path
    shipped = SHIPPED_CONFIGS / (path.name if path.suffix == ".yaml" else f"{path.name}.yaml")
    if shipped.exists() and (len(path.parts) == 1 or path.parent.name == "configs"):
        return shipped
    raise ConfigError(f"config error: file {path} does not exist (shipped configs: {', '.join(shipped_configs())})")


# the sections only one algorithm's config has: a config that names a base of another algorithm drops them
ALGORITHM_SECTIONS = {"es": ("es", "distributed", "prompt"), "grpo": ("grpo",), "ppo": ("ppo",)}


def read_config_data(path: str | Path, seen: tuple[Path, ...] = ()) -> dict:
    """A config file's fields, merged onto its `base:` (a shipped config's name or a path) when it names one:
    the file holds only what differs from the base."""
    path = resolve_config_path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0]
        raise ConfigError(f"config error: {path} is not valid YAML: {first}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config error: {path} must hold a mapping of fields, got {type(data).__name__}")
    if "base" not in data:
        return data
    if path.resolve() in seen:
        raise ConfigError(f"config error: {path}: `base` chain loops back to itself")
    base_name = data.pop("base")
    if not isinstance(base_name, str):
        raise ConfigError(f"config error: {path}: base must be a config name or path, got {base_name!r}")
    near = path.parent / base_name
    base = read_config_data(near if near.exists() else base_name, (*seen, path.resolve()))
    algo, base_algo = data.get("algo", base.get("algo", "es")), base.get("algo", "es")
    if algo != base_algo:
        base = {k: v for k, v in base.items() if k not in ALGORITHM_SECTIONS.get(base_algo, ())}
    return _deep_merge(base, data)


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> BaseTrainConfig:
    return build_config(read_config_data(path) if path is not None else {}, overrides)


def dump_config(config: BaseTrainConfig, path: str | Path) -> None:
    write_text_atomic(path, yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
