"""`esopt analyze variance`: how the variance of the policy-gradient and of the ES gradient estimator grows
with the horizon H*, measured on one fixed model.

The model is the warm-started `tiny-sudoku` (never updated here). For each H* and each of R repetitions,
each method computes one gradient estimate from a fresh batch (fresh tasks, fresh sampling seeds):
- PG (REINFORCE with a mean baseline, the GRPO estimator without the std division): B episodes,
  advantage A_i = r_i - mean(r) over the batch (or over groups of `--pg-group` rollouts of one task),
  g = (1/B) * grad sum_i A_i * sum_{turns, generated tokens} log pi(token), log-probs under the sampling
  temperature, every turn's generated ids exactly as produced.
- ES: N members (seeded Gaussian noise eps_i, the training noise), each scored on the same E tasks with
  the same sampling seeds (common random numbers, as in training), g = 1/(N sigma) sum_i (r_i - mean) eps_i.
The score r of an episode is the env's shaped reward (`reward=shaped`: the episode's sum of per-turn
rewards = 0.5 success + 0.3 progress + 0.2 valid-move rate), because binary success is 0 for nearly
every episode at large H* and would make both estimators trivially zero.

Per (method, H*) the report gives the exact trace of the estimates' sample covariance over D (`trace/D`,
from running sums over all coordinates), the same over the episode scores' variance, and `nsr` = trace /
|E g|^2 with |E g|^2 estimated without its noise bias (|mean|^2 - trace/R; inf when the signal is not
resolved at this R). Raw variances of the two estimators are not comparable (ES's scales with 1/sigma^2);
their trends with H* and their nsr are. Every estimate is also projected on K fixed random unit directions
(seeded): `var`, the projections' variance averaged over directions, is an unbiased but noisier estimate of
trace/D, and `rel_var = var / (|mean|^2 / D)` is in expectation R / (1 + R / nsr): it saturates at R when the
mean is mostly noise, so it does not compare across R. Per method, least squares fits of ln(q) vs H*
(growth rate), ln(q) vs ln(H*) (power exponent: 1 = linear) and q vs H*, for each quantity q.

    esopt analyze variance                             # H* 2 4 6 8 10 on 4x4, writes results/variance.md/png
    esopt analyze variance --h-stars 2 6 10 --repeats 32 --batch 64
    esopt analyze variance --smoke --out /tmp/v
    esopt analyze variance --merge /tmp/v12 /tmp/v4 --out /tmp/v   # runs at different H*, refitted together
    esopt analyze variance ... --out /tmp/v --resume               # continue a stopped run (OUT/variance_state)
    esopt analyze variance --device cuda --threads 8 ...            # rollouts and backward on a GPU; the
                                                                    # projections stay on the host's threads
    esopt analyze variance --device cuda --es-evaluator batched ... # ES members in one rollout (launch-bound
                                                                    # one-by-one decoding is a GPU's bottleneck)

Measured cost (2 CPU cores shared with other jobs, one torch thread): one
repetition (B=32 PG episodes + backward, and N=8 x E=4 ES episodes) takes ~1.2 s x H*, so the default
(H* 2 4 6 8 10, R=16) takes 6-10 minutes (569 s with warm start v3, 374 s with v6); `--smoke` ~10 s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml

from esopt.engines.base import SamplingParams
from esopt.train.config import check_device
from esopt.utils.faults import pause_point
from esopt.utils.io import write_json_atomic
from esopt.utils.report import add_analysis_options

METHODS = ("pg", "es")
LABELS = {"pg": "PG (REINFORCE, mean baseline)", "es": "ES"}


@dataclass
class Setup:
    h_stars: list[int] = field(default_factory=lambda: [2, 4, 6, 8, 10])
    repeats: int = 16  # R independent estimates per (method, H*)
    batch: int = 32  # B: PG episodes per estimate
    members: int = 8  # N: ES members per estimate
    member_episodes: int = 4  # E: episodes per ES member
    directions: int = 32  # K random unit directions
    sigma: float = 3e-3  # ES noise scale (the CPU training default, calibrated on the v6 warm start)
    antithetic: bool = False
    pg_group: int = 1  # 1: baseline = batch mean over B distinct tasks; G: B/G tasks x G rollouts, group mean
    seed: int = 0
    size: int = 4
    warm_start_steps: int = 800
    temperature: float = SamplingParams.temperature
    max_new_tokens: int = 10
    micro_batch: int = 64
    model: str = "tiny-sudoku"  # or "smollm2" (pretrained, with `env_kwargs` hints and `few_shot` examples)
    env_kwargs: dict = field(default_factory=dict)  # extra Sudoku arguments, e.g. {"hints": "candidates"}
    few_shot: int = 0  # worked examples in every prompt (the env's `worked_examples`)
    device: str = "cpu"  # where the model rolls out and back-propagates; estimates are projected on the host
    es_evaluator: str = "local"  # ES members one by one in place, or "batched" (one rollout, per-row weights)

    def check(self) -> None:
        if self.repeats < 2:
            raise ValueError(f"--repeats must be >= 2 to estimate a variance (got {self.repeats})")
        if min(self.batch, self.members, self.member_episodes, self.directions, self.pg_group) < 1:
            raise ValueError("--batch, --members, --member-episodes, --directions and --pg-group must be >= 1")
        if self.batch % self.pg_group:
            raise ValueError(f"--batch ({self.batch}) must be a multiple of --pg-group ({self.pg_group})")
        if self.antithetic and self.members % 2:
            raise ValueError(f"--antithetic needs an even --members (got {self.members})")
        if not self.sigma > 0:
            raise ValueError(f"--sigma must be > 0 (got {self.sigma})")
        if bad := [h for h in self.h_stars if not 1 <= h <= self.size ** 2]:
            raise ValueError(f"--h-stars {bad} out of range 1..{self.size ** 2}")
        if self.model not in ("tiny-sudoku", "smollm2"):
            raise ValueError(f"--model must be tiny-sudoku or smollm2 (got {self.model!r})")
        if clash := sorted({"size", "h_star", "reward"} & set(self.env_kwargs)):
            raise ValueError(f"--env-arg {clash}: set by the analysis itself (use --size / --h-stars)")
        if self.es_evaluator not in ("local", "batched"):
            raise ValueError(f"--es-evaluator must be local or batched (got {self.es_evaluator!r})")
        try:
            check_device(self.device)
        except ValueError as e:
            raise ValueError(f"--device {self.device!r}: {e}") from None


SMOKE = dict(h_stars=[1, 2], repeats=3, batch=4, members=4, member_episodes=2, directions=4, warm_start_steps=60,
             sigma=1e-2)  # at 3e-3 every member of the 60-step warm start scores the same (zero variance)


# --- projections and fits (pure) -------------------------------------------------------------------

class RandomDirections:
    """K seeded directions, uniform on the sphere in R^dim, never held whole: each block of `chunk`
    coordinates is regenerated from (seed, block) when needed, so K x 135M fp32 (17 GB for SmolLM2) stays
    K x chunk in memory. Projections are exact for these directions; regenerating costs one randn pass."""

    def __init__(self, dim: int, k: int, seed: int, chunk: int = 1 << 20):
        self.dim, self.k, self.seed, self.chunk = dim, k, seed, chunk
        sq = torch.zeros(k, dtype=torch.float64)
        for _, block in self.blocks():
            sq += block.double().square().sum(1)
        self.norms = sq.sqrt().float()  # (K,)

    def blocks(self):
        """(start, (K, n) unnormalised Gaussian block) over the coordinates, the same every time."""
        for i, start in enumerate(range(0, self.dim, self.chunk)):
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
            yield start, torch.randn(self.k, min(self.chunk, self.dim - start), generator=gen)

    def project(self, g: torch.Tensor) -> torch.Tensor:
        """(K,) projections of a flat (dim,) vector on the unit directions."""
        out = torch.zeros(self.k, dtype=torch.float64)
        for start, block in self.blocks():
            out += (block @ g[start:start + block.shape[1]]).double()
        return out / self.norms.double()

    def dense(self) -> torch.Tensor:
        """(K, dim) unit rows (small dims only: tests, plots)."""
        return torch.cat([b for _, b in self.blocks()], dim=1) / self.norms[:, None]


def random_directions(dim: int, k: int, seed: int) -> torch.Tensor:
    """(k, dim) rows of unit norm, uniformly distributed on the sphere, from a seeded generator."""
    return RandomDirections(dim, k, seed).dense()


class ProjectionStats:
    """Accumulates estimates g_r (flat vectors): their projections on K fixed directions, their sum and
    squared norms; `result()` gives the projected variance and the noise-to-signal numbers."""

    def __init__(self, dim: int, directions: int | torch.Tensor | RandomDirections | None, seed: int = 0):
        """`directions`: how many to draw from `seed`, or shared directions ((K, dim) unit rows or a
        `RandomDirections`); None: only for reading saved estimates (`load_state_dict`, `result`)."""
        self.dim = dim
        self.u = RandomDirections(dim, directions, seed) if isinstance(directions, int) else directions
        self.proj: list[np.ndarray] = []
        self.total = torch.zeros(dim if self.u is not None else 0, dtype=torch.float64)  # reading: load_state_dict
        self.sq_norms: list[float] = []

    def add(self, g: torch.Tensor) -> None:
        u = self.u
        g = g.detach().reshape(-1).float().cpu()
        if u is None:
            raise ValueError("these statistics were made for reading (no directions): they take no estimates")
        if g.numel() != self.dim:
            raise ValueError(f"estimate has {g.numel()} elements, expected {self.dim}")
        self.proj.append((u.project(g) if isinstance(u, RandomDirections) else (u @ g).double()).numpy())
        self.total += g.double()
        self.sq_norms.append(float(g.double().square().sum()))

    @property
    def mean(self) -> torch.Tensor:
        return self.total / max(len(self.proj), 1)

    def state_dict(self) -> dict:
        return {"proj": [p.tolist() for p in self.proj], "total": self.total, "sq_norms": list(self.sq_norms)}

    def load_state_dict(self, state: dict) -> None:
        self.proj = [np.asarray(p, dtype=np.float64) for p in state["proj"]]
        self.total = state["total"].to(torch.float64)
        self.sq_norms = list(state["sq_norms"])

    def result(self) -> dict[str, float]:
        r = len(self.proj)
        if r < 2:
            raise ValueError(f"need >= 2 estimates for a variance, have {r}")
        p = np.stack(self.proj)  # (R, K)
        var_k = p.var(axis=0, ddof=1)  # (K,)
        mean_sq = float(self.mean.square().sum())
        trace = (sum(self.sq_norms) - r * mean_sq) / (r - 1)  # exact trace of the sample covariance
        signal = mean_sq - trace / r  # unbiased |E g|^2; <= 0 (up to rounding): not resolved
        signal = signal if signal > 1e-9 * mean_sq else 0.0
        var = float(var_k.mean())
        return {
            "var": var, "var_se": float(var_k.std(ddof=1) / math.sqrt(len(var_k))) if len(var_k) > 1 else 0.0,
            "trace_per_dim": trace / self.dim, "mean_sq_norm": mean_sq, "signal_sq": signal,
            "rel_var": var / (mean_sq / self.dim) if mean_sq > 0 else math.inf,
            "nsr": trace / signal if signal > 0 else math.inf, "repeats": r,
            # the standard error of mean |g_r|^2 / D, which trace/D is up to the (small when noisy) mean's term:
            # one heavy-tailed repetition shows here
            "trace_se_per_dim": float(np.std(self.sq_norms, ddof=1) / math.sqrt(r)) / self.dim,
            "sq_norms": list(self.sq_norms),
        }


def fit_line(x: list[float], y: list[float]) -> dict[str, float]:
    """Least squares y = slope * x + intercept, with R^2 (nan when fewer than 2 finite points)."""
    pts = [(a, b) for a, b in zip(x, y) if math.isfinite(a) and math.isfinite(b)]
    if len(pts) < 2 or len({a for a, _ in pts}) < 2:
        return {"slope": math.nan, "intercept": math.nan, "r2": math.nan}
    xs, ys = np.array([a for a, _ in pts]), np.array([b for _, b in pts])
    slope, intercept = np.polyfit(xs, ys, 1)
    resid = ys - (slope * xs + intercept)
    ss = float(((ys - ys.mean()) ** 2).sum())
    return {"slope": float(slope), "intercept": float(intercept), "r2": 1 - float((resid**2).sum()) / ss if ss else 1.0}


def fits(h_stars: list[int], var: list[float]) -> dict[str, dict[str, float]]:
    pos = [(h, v) for h, v in zip(h_stars, var) if v > 0]
    return {
        "log_var_vs_h": fit_line([h for h, _ in pos], [math.log(v) for _, v in pos]),
        "log_var_vs_log_h": fit_line([math.log(h) for h, _ in pos], [math.log(v) for _, v in pos]),
        "var_vs_h": fit_line(list(h_stars), list(var)),
    }


# --- estimators ------------------------------------------------------------------------------------

def flat_grad(params: list[tuple[str, torch.nn.Parameter]]) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1).float().cpu()
                      for _, p in params])


def baseline_advantages(scores: np.ndarray, group: int) -> np.ndarray:
    """scores - mean over consecutive groups of `group` (group 1: the whole batch's mean)."""
    scores = np.asarray(scores, dtype=np.float64)
    if group <= 1:
        return scores - scores.mean()
    g = scores.reshape(-1, group)
    return (g - g.mean(1, keepdims=True)).reshape(-1)


def pg_estimate(policy, params, trajectories, advantages: np.ndarray, temperature: float, micro: int) -> torch.Tensor:
    """(1/B) grad sum_i A_i sum_t log pi(generated tokens of episode i, turn t), as a flat vector."""
    from esopt.train.pg import collate, micro_batches, prefix_once, token_logprobs, turn_samples

    for _, p in params:
        p.grad = None
    samples = turn_samples(trajectories, [[float(a)] * t.num_turns for a, t in zip(advantages, trajectories)])
    if samples:
        batch = collate(samples, policy.tokenizer.pad_token_id, policy.device)
        with torch.enable_grad(), prefix_once([policy.model], batch):  # the few-shot prefix: encoded once
            for idx in micro_batches(len(batch), micro):
                part = batch.select(idx)
                logp = token_logprobs(policy.model, part, temperature)
                ((logp * part.mask).sum(1) * part.advantages).sum().div(len(trajectories)).backward()
    g = flat_grad(params)
    for _, p in params:
        p.grad = None
    return g


def es_estimate(es, members, scores: np.ndarray, sigma: float) -> torch.Tensor:
    """1/(N sigma) sum_i (r_i - mean r) sign_i eps_i, with the members' own seeded noise, as a flat vector."""
    coefs: dict[int, float] = {}
    for m, r in zip(members, scores - scores.mean()):
        coefs[m.seed] = coefs.get(m.seed, 0.0) + m.sign * float(r) / (len(members) * sigma)
    return torch.cat([t.reshape(-1).cpu() for t in es.perturbation.combine(coefs)])


# --- the analysis ----------------------------------------------------------------------------------

def tally(info: dict, trajectories: list, tokens: int) -> list[float]:
    """Add a batch of episodes to one method's running record (scores, turns, tokens, episodes); returns the
    batch's shaped scores."""
    from esopt.rollout import trajectory_score

    scores = [trajectory_score(t, "shaped") for t in trajectories]
    info["scores"] += scores
    info["turns"] += [t.num_turns for t in trajectories]
    info["tokens"] += tokens
    info["episodes"] += len(trajectories)
    return scores


def _seeds(*key: int, n: int) -> list[int]:
    return [int(s) for s in np.random.default_rng([*key, 29]).integers(0, 2**31, size=n)]


def model_section(setup: Setup):
    """The model section of the fixed model the analysis measures (never updated): the tiny warm start or SmolLM2."""
    from esopt.train.config import ModelSection

    warm = {"warm_start_steps": setup.warm_start_steps} if setup.model == "tiny-sudoku" else {}
    return ModelSection(name=setup.model, device=setup.device, **warm)


def fixed_model(setup: Setup):
    from esopt.train.models import load_model

    return load_model(model_section(setup), {"size": setup.size})


def compute_dtype(setup: Setup) -> str:
    """The dtype the fixed model computes in ("auto" resolved, as it loads). Repetitions in two dtypes measure two
    slightly different models: a run does not resume in, nor merge with, another dtype (a 2-core VM may come back
    on another CPU type)."""
    return model_section(setup).resolved_dtype


def device_kind(spec: str) -> str:
    """The kind of device a spec runs on ("auto" resolved): what decides which ES noise a seed draws."""
    if spec == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(spec).type


class RunState:
    """A run's progress in OUT/variance_state/, so an hours-long analysis survives being stopped: per H*,
    after every repetition, the estimates' accumulators (h{H*}.pt, written atomically, ~2 x 8 bytes x D: 2.2 GB
    for SmolLM2); once an H* is done, its rows (h{H*}.json) replace them. Every repetition draws its tasks,
    sampling seeds and ES noise from (seed, H*, repetition), so a resumed run gives the rows of an
    uninterrupted one (on the CPU, with the same --threads; CUDA's backward is not bit-reproducible). The
    folder is removed once the whole run is written."""

    def __init__(self, folder: Path, setup: Setup, resume: bool):
        self.folder = folder
        self.key = {k: v for k, v in asdict(setup).items() if k != "h_stars"}
        self.key["device"] = device_kind(setup.device)  # cuda and cuda:0 draw alike; auto as it resolved
        self.key["dtype"] = compute_dtype(setup)
        if not (folder / "setup.json").exists():  # nothing saved, or a finished run's removal cut short
            shutil.rmtree(folder, ignore_errors=True)
            return
        if not resume:
            raise ValueError(f"{folder} holds an unfinished run: pass --resume to continue it, or delete it")
        saved = with_old_defaults(json.loads((folder / "setup.json").read_text()))
        if diff := sorted(k for k in saved.keys() | self.key.keys() if saved.get(k) != self.key.get(k)):
            raise ValueError(f"--resume: {folder} was started with another {', '.join(diff)}; "
                             "only --h-stars may differ")
        held = sorted(int(f.stem[1:]) for f in folder.glob("h*.*") if f.suffix in (".json", ".pt"))
        if missing := sorted(set(held) - set(setup.h_stars)):
            raise ValueError(f"--resume: {folder} holds work at H*={missing}, which --h-stars {setup.h_stars} "
                             "leaves out (the run would delete it): add them")

    def finished(self, h: int) -> dict | None:
        path = self.folder / f"h{h}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def partial(self, h: int) -> dict | None:
        path = self.folder / f"h{h}.pt"
        return torch.load(path, weights_only=True) if path.exists() else None

    def _started(self) -> None:
        if not (self.folder / "setup.json").exists():  # written with the first saved work, so a run that
            write_json_atomic(self.folder / "setup.json", self.key)  # fails before any leaves nothing behind

    def save_partial(self, h: int, state: dict) -> None:
        self._started()
        tmp = self.folder / f".h{h}.pt.tmp"
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.folder / f"h{h}.pt")
        pause_point("variance", h_star=h, repeats_done=state["done"])

    def finish(self, h: int, done: dict) -> None:
        self._started()
        write_json_atomic(self.folder / f"h{h}.json", done)
        (self.folder / f"h{h}.pt").unlink(missing_ok=True)

    def remove(self) -> None:
        """setup.json first, so a removal cut short leaves a folder that counts as empty."""
        (self.folder / "setup.json").unlink(missing_ok=True)
        shutil.rmtree(self.folder, ignore_errors=True)


def peek(folder: Path) -> dict:
    """What an unfinished run has measured so far (`--peek`), read from its saved state while it may still run:
    finished H* as saved; an H* in progress from its first repetitions. Repetitions are seeded by their index,
    so those rows are the rows of a run with --repeats = the repetitions done. Reads only."""
    state = folder / "variance_state"
    if not (state / "setup.json").exists():
        raise ValueError(f"--peek {folder}: no saved run there (variance_state/setup.json): nothing measured yet, "
                         "or the run finished and wrote variance.json")
    setup = with_old_defaults(json.loads((state / "setup.json").read_text()))
    rows, seconds, dim, done = [], 0.0, 0, {}
    finished = {int(f.stem[1:]) for f in state.glob("h*.json")}
    for path in sorted(state.glob("h*.*"), key=lambda f: int(f.stem[1:])):
        h = int(path.stem[1:])
        if path.suffix not in (".json", ".pt") or (path.suffix == ".pt" and h in finished):
            continue
        try:
            saved = json.loads(path.read_text()) if path.suffix == ".json" else torch.load(path, weights_only=True)
        except FileNotFoundError:  # the run finished this H* (or itself) meanwhile
            continue
        seconds += saved["seconds"]
        if path.suffix == ".json":
            rows += saved["rows"]
            continue
        done[h], dim = saved["done"], saved["acc"]["pg"]["total"].numel()
        acc = {m: ProjectionStats(dim, None) for m in METHODS}
        for m in METHODS:
            acc[m].load_state_dict(saved["acc"][m])
        if saved["done"] >= 2:  # fewer gives no variance
            rows += horizon_rows(h, acc, saved["info"], saved["done"])
    return {"setup": {**setup, "h_stars": sorted({r["h_star"] for r in rows} | set(done))}, "dim": dim or None,
            "seconds": seconds, "rows": rows, "fits": fits_per_method(rows), "in_progress": done}


def measure(setup: Setup, progress: bool = True, state: RunState | None = None) -> dict:
    """Run the analysis; returns {"setup", "rows": [per (method, H*)], "fits": {method: {...}}}. With
    `state`, each repetition is saved and finished work is taken from it (see RunState)."""
    from esopt.envs import make_env
    from esopt.es import ES, ESConfig, ParamScope, select_parameters
    from esopt.population import PopulationContext, build_evaluator
    from esopt.rollout import RolloutSpec, env_examples

    setup.check()
    policy = fixed_model(setup)
    params = select_parameters(policy.model, ParamScope())
    dim = sum(p.numel() for _, p in params)
    sampling = SamplingParams(temperature=setup.temperature, max_new_tokens=setup.max_new_tokens)
    es = ES(policy.model, ESConfig(population_size=setup.members, antithetic=setup.antithetic, sigma=setup.sigma,
                                   sigma_min=setup.sigma, sigma_schedule="constant", alpha=0.0, seed=setup.seed))
    directions = RandomDirections(dim, setup.directions, setup.seed)  # the same K directions everywhere
    rows, seconds = [], 0.0
    for h in setup.h_stars:
        if state and (done := state.finished(h)):
            rows += done["rows"]
            seconds += done["seconds"]
            continue
        t0 = time.perf_counter()
        kwargs = {**setup.env_kwargs, "size": setup.size, "h_star": h, "reward": "shaped"}

        def make(kwargs=kwargs):
            return make_env("esopt/Sudoku-v0", **kwargs)

        with make() as env:
            spec = RolloutSpec(sampling=sampling, examples=tuple(env_examples(env, setup.few_shot)))
        # ES members run as in training: one by one in place ("local") or all in one batch ("batched")
        evaluator = build_evaluator(setup.es_evaluator, PopulationContext(es=es, engine=policy, make_env=make,
                                                                          score="shaped"))

        acc = {m: ProjectionStats(dim, directions) for m in METHODS}
        info = {m: {"scores": [], "turns": [], "tokens": 0, "episodes": 0} for m in METHODS}
        start, before = 0, 0.0
        if state and (saved := state.partial(h)):
            for m in METHODS:
                acc[m].load_state_dict(saved["acc"][m])
            info, start, before = saved["info"], saved["done"], saved["seconds"]
            if progress:
                print(f"H*={h}: resumed after repetition {start}/{setup.repeats}", flush=True)
        for r in range(start, setup.repeats):
            # PG: B episodes (B/G tasks x G rollouts), advantage = score - batch (group) mean
            tasks = [s for s in _seeds(setup.seed, h, r, 0, n=setup.batch // setup.pg_group)
                     for _ in range(setup.pg_group)]
            trajs, stats = spec.run(policy, make, tasks, seed=_seeds(setup.seed, h, r, 1, n=1)[0])
            scores = np.array(tally(info["pg"], trajs, stats.generated_tokens))
            adv = baseline_advantages(scores, setup.pg_group)
            acc["pg"].add(pg_estimate(policy, params, trajs, adv, setup.temperature or 1.0, setup.micro_batch))
            # ES: N members on the same E tasks and sampling seeds (common random numbers)
            members = es.ask(generation=1_000 * h + r)
            tasks, seed = _seeds(setup.seed, h, r, 2, n=setup.member_episodes), _seeds(setup.seed, h, r, 3, n=1)[0]
            with torch.no_grad():
                results = evaluator.evaluate(members, setup.sigma, tasks, seed, spec)
            for res in results:
                tally(info["es"], res.trajectories, res.stats.generated_tokens)
            acc["es"].add(es_estimate(es, members, np.array([res.reward for res in results]), setup.sigma))
            if state:
                state.save_partial(h, {"done": r + 1, "seconds": before + time.perf_counter() - t0, "info": info,
                                       "acc": {m: acc[m].state_dict() for m in METHODS}})
            if progress:
                took = time.perf_counter() - t0  # this process's repetitions only: a resume's pace is its own
                left = took / (r + 1 - start) * (setup.repeats - r - 1)
                print(f"H*={h} repetition {r + 1}/{setup.repeats} | {before + took:.0f}s | ~{left / 60:.0f} min "
                      f"left at H*={h}", flush=True)
        mine, took = horizon_rows(h, acc, info, setup.repeats), before + time.perf_counter() - t0
        rows += mine
        seconds += took
        if state:
            state.finish(h, {"rows": mine, "seconds": took})
        if progress:
            print("  " + " | ".join(f"{r['method']}: trace/D {r['trace_per_dim']:.3e} nsr {_g(r['nsr'])}"
                                    for r in mine), flush=True)
    # the device kind the noise was drawn on ("auto" resolved; cuda:0 and cuda:1 draw alike) and the model's dtype:
    # what --merge compares besides the options
    return {"setup": {**asdict(setup), "device": torch.device(policy.device).type, "dtype": compute_dtype(setup)},
            "dim": dim, "seconds": seconds, "rows": rows, "fits": fits_per_method(rows)}


def horizon_rows(h: int, acc: dict[str, ProjectionStats], info: dict[str, dict], repeats: int) -> list[dict]:
    """One H*'s rows (PG, then ES) from its accumulated estimates and episode records."""
    mean_pg, mean_es = acc["pg"].mean, acc["es"].mean
    cos = float(mean_pg @ mean_es / (mean_pg.norm() * mean_es.norm() + 1e-30))
    return [with_score_ratios({
        "method": m, "h_star": h, **acc[m].result(), "cos_pg_es": cos,
        "score_mean": float(np.mean(info[m]["scores"])), "score_std": float(np.std(info[m]["scores"])),
        "mean_turns": float(np.mean(info[m]["turns"])),
        "tokens_per_episode": info[m]["tokens"] / max(info[m]["episodes"], 1),
        "episodes_per_estimate": info[m]["episodes"] // repeats}) for m in METHODS]


def with_score_ratios(row: dict) -> dict:
    """var and trace/D over the episode scores' variance (inf when the scores do not vary); kept if present."""
    sv = row["score_std"] ** 2
    for q, ratio in (("var", "var_per_score_var"), ("trace_per_dim", "trace_per_score_var")):
        row.setdefault(ratio, row[q] / sv if sv > 0 else math.inf)
    return row


FITTED = ("trace_per_dim", "trace_per_score_var", "nsr", "var", "rel_var", "var_per_score_var")


def fits_per_method(rows: list[dict]) -> dict[str, dict]:
    out = {}
    for m in METHODS:
        mine = [r for r in rows if r["method"] == m]
        out[m] = {q: fits([r["h_star"] for r in mine], [r[q] for r in mine])
                  for q in FITTED}
    return out


def merge(results: list[dict], sources: list[str] | None = None) -> dict:
    """One result from runs of the same setup at different horizons (e.g. an expensive H* run on its own),
    with the fits refitted over all of them. Each H* is measured from seeds of its own (tasks, sampling,
    ES noise per (seed, H*, repetition)), so a merged row is the row a single run over every H* gives."""
    sources = sources or [f"result {i + 1}" for i in range(len(results))]
    if len(results) < 2:
        raise ValueError("--merge needs at least two variance.json results")
    first = {k: v for k, v in results[0]["setup"].items() if k != "h_stars"}
    seen: dict[int, str] = {}
    for res, src in zip(results, sources):
        setup = {k: v for k, v in res["setup"].items() if k != "h_stars"}
        if diff := sorted(k for k in first.keys() | setup.keys() if first.get(k) != setup.get(k)):
            raise ValueError(f"{src}: its setup differs from {sources[0]}'s in {', '.join(diff)}; only H* may differ")
        if res["dim"] != results[0]["dim"]:
            raise ValueError(f"{src}: model of {res['dim']:,} parameters, {sources[0]}: {results[0]['dim']:,}")
        for h in res["setup"]["h_stars"]:
            if h in seen:
                raise ValueError(f"H*={h} is in both {seen[h]} and {src}")
            seen[h] = src
    rows = sorted((r for res in results for r in res["rows"]), key=lambda r: (r["h_star"], METHODS.index(r["method"])))
    return {"setup": {**results[0]["setup"], "h_stars": sorted(seen)}, "dim": results[0]["dim"],
            "seconds": sum(res["seconds"] for res in results), "rows": rows, "fits": fits_per_method(rows),
            "merged_from": list(sources)}


def with_old_defaults(setup: dict) -> dict:
    """A setup saved before --device and --es-evaluator existed ran on the CPU with members one by one."""
    return {"device": "cpu", "es_evaluator": "local", **setup}


def load_result(path: str) -> dict:
    """A variance.json, given as the file or as the folder `--out` wrote it to."""
    p = Path(path)
    p = p / "variance.json" if p.is_dir() else p
    if not p.is_file():
        raise ValueError(f"--merge {path}: no variance.json there")
    try:
        result = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--merge {path}: not a variance.json ({e})") from None
    missing = {"setup", "dim", "seconds", "rows"} - (result.keys() if isinstance(result, dict) else set())
    if missing:
        raise ValueError(f"--merge {path}: not a variance.json (no {', '.join(sorted(missing))})")
    result["setup"] = with_old_defaults(result["setup"])
    for row in result["rows"]:  # files written before trace_per_score_var existed gain it
        with_score_ratios(row)
    return result


# --- report ----------------------------------------------------------------------------------------

def _g(x: float) -> str:
    return "inf" if x == math.inf else ("nan" if not math.isfinite(x) else f"{x:.3g}")


def report(result: dict) -> str:
    s, rows = result["setup"], result["rows"]
    groups = "" if s["pg_group"] == 1 else f" ({s['batch'] // s['pg_group']} tasks x {s['pg_group']})"
    model = s.get("model", "tiny-sudoku")
    dim = f"{result['dim']:,}" if result["dim"] else "D"  # a --peek at finished H* only does not know it
    about = (f"tiny-sudoku (warm start {s['warm_start_steps']} steps" if model == "tiny-sudoku"
             else f"{model} (env arguments {s.get('env_kwargs') or {}}, {s.get('few_shot', 0)} worked examples")
    lines = [
        f"# Gradient-estimator variance vs horizon ({s['size']}x{s['size']} Sudoku, fixed {model} model)", "",
        *([] if (going := result.get("in_progress")) is None else [
            "**Preliminary**, read from an unfinished run's saved state (`--peek`): " + (", ".join(
                f"H*={h} after {n} of {s['repeats']} repetitions"
                + (" (too few for a variance)" if n < 2 else f" (its rows are a run with --repeats {n})")
                for h, n in going.items()) or "the finished H* only (the next has no repetition saved yet)")
            + "; not a result.", ""]),
        f"Model: {about}, {dim} parameters{', ' + s['dtype'] if s.get('dtype') else ''}), never updated. "
        f"Score: the env's **shaped reward** (episode sum = 0.5 success + 0.3 progress + 0.2 valid-move rate; binary "
        f"success is ~0 at large H*). Sampling T={s['temperature']}, top-p 0.8, top-k 20, {s['max_new_tokens']} new "
        f"tokens. R={s['repeats']} independent estimates per (method, H*); PG: B={s['batch']} episodes{groups}, "
        "advantage = "
        f"score - {'batch' if s['pg_group'] == 1 else 'group'} mean, sum of log-probs over every generated token; "
        f"ES: N={s['members']} members x E={s['member_episodes']} episodes, sigma={s['sigma']}"
        f"{', antithetic' if s['antithetic'] else ''}. Projections on K={s['directions']} random unit directions "
        f"(seed {s['seed']}). {result['seconds']:.0f}s"
        + (f" in all, merged from {len(result['merged_from'])} runs ({', '.join(result['merged_from'])})."
           if result.get("merged_from") else "."), "",
        "`trace/D`: the estimates' total variance over repetitions per coordinate (the trace of their sample "
        "covariance over D, exact, from all coordinates; ± the standard error of the repetitions' mean squared "
        "norm over D: it shows a heavy-tailed repetition, and overstates the trace's error when the signal is "
        "strong, by about sqrt(1 + 2/nsr)); `/ score var`: the same over the variance of the episode "
        "scores (the shaped score's spread changes with H*; this removes it). `nsr` = trace / |E g|^2, with |E g|^2 "
        "estimated without its noise bias (|mean|^2 - trace/R): how many estimates it takes to average the noise "
        "down to the signal (inf: the signal is not resolved with this R). `var (K dirs)`: the variance of the "
        "projections on K random unit directions, mean over directions (± their spread as a standard error); an "
        "unbiased but much noisier estimate of trace/D (a policy gradient concentrates in few coordinates). "
        "`rel_var` = var / (|mean|^2 / D): in expectation R / (1 + R / nsr), so it saturates at R when the mean "
        "is mostly noise (K directions can put it above R) and is **not** comparable across R. `cos`: cosine of "
        "the mean PG and mean ES estimates.",
        "", "| H* | method | mean turns | score mean ± std | trace/D | / score var | nsr | var (K dirs) | rel_var "
        "| cos |", "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        se = r.get("trace_se_per_dim", math.nan)  # runs before it was kept have none
        lines.append(f"| {r['h_star']} | {r['method'].upper()} | {r['mean_turns']:.1f} | {r['score_mean']:.3f} ± "
                     f"{r['score_std']:.3f} | {_g(r['trace_per_dim'])}{f' ± {_g(se)}' if math.isfinite(se) else ''} "
                     f"| {_g(r['trace_per_score_var'])}"
                     f" | {_g(r['nsr'])} | {_g(r['var'])} ± {_g(r['var_se'])} | {_g(r['rel_var'])} "
                     f"| {r['cos_pg_es']:.2f} |")
    lines += ["", "## Fits (least squares over H*)", "",
              "| method | quantity q | d ln(q)/dH* | exponent (ln q vs ln H*) | R^2 (log-log) | d q/dH* |",
              "|---|---|---|---|---|---|"]
    for m, per in result["fits"].items():
        for q, f in per.items():
            lines.append(
                f"| {m.upper()} | {q} | {_g(f['log_var_vs_h']['slope'])} | {_g(f['log_var_vs_log_h']['slope'])}"
                f" | {_g(f['log_var_vs_log_h']['r2'])} | {_g(f['var_vs_h']['slope'])} |"
            )
    lines += ["", "The paper says the policy-gradient variance grows about linearly in H (exponent ~1); the "
              "table reports what this model and budget give.", "", "![variance vs H*](variance.png)", ""]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from esopt.utils.plots import save_figure

    panels = (("trace_per_dim", "trace/D", "variance of the estimate"),
              ("trace_per_score_var", "trace/D / score var", "per unit score variance"),
              ("nsr", "trace / |E g|^2 (finite only)", "noise-to-signal (unresolved left out)"))
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 3.8))
    first = result["rows"][0]["h_star"]
    for k, m in enumerate(METHODS):
        mine = [r for r in result["rows"] if r["method"] == m]
        for ax, (q, _, _) in zip(axes, panels):
            pts = [(r["h_star"], r[q]) for r in mine if math.isfinite(r[q]) and r[q] > 0]
            # the methods' variances differ by orders of magnitude: variances are relative to the first H*
            ref = pts[0][1] if q != "nsr" and pts else 1.0
            ax.plot([h for h, _ in pts], [v / ref for _, v in pts], marker="o", color=f"C{k}", label=m.upper())
            f = result["fits"][m][q]["log_var_vs_log_h"]
            if math.isfinite(f["slope"]):
                hs = [h for h, _ in pts]
                ax.plot(hs, [math.exp(f["intercept"]) * h ** f["slope"] / ref for h in hs], "--", color=f"C{k}",
                        alpha=0.6, label=f"{m.upper()} fit: H*^{f['slope']:.2f}")
    hs = sorted({r["h_star"] for r in result["rows"]})
    for ax, (q, label, title) in zip(axes, panels):
        ax.set(xscale="log", yscale="log", xlabel="H*", title=title,
               ylabel=label if q == "nsr" else f"{label}, relative to H*={first}")
        ax.set_xticks(hs, [str(h) for h in hs])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    for ax in axes:
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def write(result: dict, out: Path) -> tuple[Path, Path, str]:
    out.mkdir(parents=True, exist_ok=True)
    text = report(result)
    (out / "variance.md").write_text(text)
    (out / "variance.json").write_text(json.dumps(result, indent=1, default=str))
    return out / "variance.md", plot(result, out / "variance.png"), text


def build_parser() -> argparse.ArgumentParser:
    d = Setup()
    p = argparse.ArgumentParser(prog="esopt analyze variance", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--h-stars", nargs="+", type=int, default=None, help=f"horizons (default {d.h_stars})")
    p.add_argument("--repeats", "-R", type=int, help=f"independent estimates per (method, H*) (default {d.repeats})")
    p.add_argument("--batch", "-B", type=int, help=f"PG episodes per estimate (default {d.batch})")
    p.add_argument("--members", "-N", type=int, help=f"ES members per estimate (default {d.members})")
    p.add_argument("--member-episodes", "-E", type=int, help=f"episodes per ES member (default {d.member_episodes})")
    p.add_argument("--directions", "-K", type=int, help=f"random projection directions (default {d.directions})")
    p.add_argument("--sigma", type=float, help=f"ES noise scale (default {d.sigma})")
    p.add_argument("--antithetic", action="store_true", help="ES members in mirrored pairs")
    p.add_argument("--pg-group", type=int,
                   help="PG baseline over groups of G rollouts of one task (default 1: batch mean)")
    p.add_argument("--size", type=int, choices=[4, 6], help="board size (default 4)")
    p.add_argument("--warm-start-steps", type=int, help=f"tiny-sudoku warm start steps (default {d.warm_start_steps})")
    p.add_argument("--seed", type=int, help="seed of tasks, sampling, ES noise and directions (default 0)")
    p.add_argument("--model", choices=["tiny-sudoku", "smollm2"], help="the fixed model (default tiny-sudoku)")
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Sudoku argument (repeatable), e.g. hints=candidates examples=episode")
    p.add_argument("--few-shot", type=int, help="worked examples in every prompt (default 0)")
    p.add_argument("--temperature", type=float, help=f"sampling temperature (default {d.temperature})")
    p.add_argument("--micro-batch", type=int, help="PG backward micro-batch (default 64; smollm2: 16, for memory)")
    p.add_argument("--device", help="cpu (default), cuda, cuda:N or auto: where rollouts and backward passes run "
                                    "(CUDA draws other ES noise than the CPU for a seed: runs on both do not merge)")
    p.add_argument("--es-evaluator", choices=["local", "batched"],
                   help="ES members one by one, perturbed in place (default, as `esopt train`), or all in one "
                        "batched rollout with per-member weight copies (a GPU's way; other sampled episodes)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run saved in OUT/variance_state (saved after every repetition; the setup "
                        "must match)")
    p.add_argument("--peek", metavar="RUN",
                   help="measure nothing: print what the unfinished run in RUN (its --out) has measured so far, "
                        "from its saved state, while it goes on; writes nothing")
    p.add_argument("--merge", nargs="+", metavar="RUN",
                   help="measure nothing: merge earlier runs' variance.json (files or --out folders) of the same "
                        "setup at different H* into one table, with the fits over all their H*")
    add_analysis_options(p, "OUT/variance.md, .png, .json")
    return p


SETUP_OPTIONS = ("h_stars", "repeats", "batch", "members", "member_episodes", "directions", "sigma", "pg_group",
                 "size", "warm_start_steps", "seed", "model", "few_shot", "temperature", "micro_batch", "device",
                 "es_evaluator")


def setup_from_args(args: argparse.Namespace) -> Setup:
    setup = Setup(**SMOKE) if args.smoke else Setup()
    for key in SETUP_OPTIONS:
        if getattr(args, key) is not None:
            setattr(setup, key, getattr(args, key))
    for item in args.env_arg:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--env-arg {item!r}: expected KEY=VALUE")
        setup.env_kwargs[key] = yaml.safe_load(value)
    if setup.model == "smollm2" and args.micro_batch is None:
        # backward through few-shot prompts of a 135M model: bound the activations (the shared prefix is
        # encoded once per estimate, `prefix_once`, so a row costs only its own tokens)
        setup.micro_batch = 16
    setup.antithetic = setup.antithetic or args.antithetic
    setup.check()
    return setup


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.merge or args.peek:
        given = [k for k in SETUP_OPTIONS if getattr(args, k) is not None]
        given += [k for k in ("smoke", "antithetic", "env_arg", "resume") if getattr(args, k)]
        verb = "--peek" if args.peek else "--merge"
        given += ["merge"] if args.peek and args.merge else []
        if given:
            raise ValueError(f"{verb} measures nothing, so --{given[0].replace('_', '-')} has no effect; drop it")
    if args.peek:
        print(report(peek(Path(args.peek))))
        return 0
    if args.merge:
        result, state = merge([load_result(x) for x in args.merge], sources=args.merge), None
    else:
        torch.set_num_threads(args.threads)
        setup = setup_from_args(args)
        state = RunState(Path(args.out) / "variance_state", setup, resume=args.resume)
        result = measure(setup, progress=not args.quiet, state=state)
    md, png, text = write(result, Path(args.out))
    if state:
        state.remove()
    print(text)
    print(f"wrote {md}, {png} and {md.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
