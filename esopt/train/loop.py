"""The one training loop every algorithm (ES, GRPO, PPO) runs.

An `Algorithm` does one step (rollouts and an update) and returns its metrics row; it owns its
weights-and-state. This loop owns everything else, written once: the run directory, the held-out eval
schedule, the progress bar and log line, checkpoints, Ctrl-C handling, resume and the summary.

    step s: row = algorithm.step(s) -> metrics.jsonl -> eval every `eval.every` and at the end
            -> checkpoint every `checkpoint_every` and at the end

A step's update happens completely or not at all (the algorithm defers SIGINT around it), so a Ctrl-C
leaves the weights of the last finished step, which are checkpointed before the loop exits.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from esopt.engines.base import Engine
from esopt.train.config import BaseTrainConfig
from esopt.train.evaluate import cached_base_eval, curve_config, evaluate, rollout_spec
from esopt.train.memprobe import inference_peak_bytes
from esopt.train.rundir import RunDir, read_summary
from esopt.train.tasks import env_factory
from esopt.utils.memory import fmt_bytes, peak_memory_bytes
from esopt.utils.progress import progress_bar, say
from esopt.utils.timers import Timers


class Algorithm(Protocol):
    """One training algorithm as the loop sees it."""

    policy: Engine
    unit: str  # what one step is called in logs: "generation" (ES) or "step"
    steps_done: int  # steps whose update is complete (set inside the update's SIGINT-deferred block)

    def step(self, step: int) -> dict:
        """Roll out and update once; returns the metrics row (numbers, `reward_mean`/`reward_max` at least)."""
        ...

    def describe(self, row: dict) -> str:
        """The algorithm's part of the per-step log line."""
        ...

    def checkpoint_files(self) -> dict:
        """Extra files a checkpoint holds (optimizer state...): {name: text or callable(path)}."""
        ...

    def time_note(self, timers: Timers) -> str:
        """The summary's note on where the time went."""
        ...

    def time_shares(self, timers: Timers) -> dict[str, float]:
        """The algorithm's own shares of the time split (ES: its overhead; GRPO/PPO: the update)."""
        ...

    def final_files(self) -> dict:
        """Extra files beside the final weights (the prompt program)."""
        ...

    def close(self) -> None:
        """Release workers and clusters."""
        ...


# (run dir, config, make_env, timers, resume, progress) -> (algorithm, first step)
Setup = Callable[[RunDir, BaseTrainConfig, Callable, Timers, bool, bool], tuple[Algorithm, int]]


def train(config: BaseTrainConfig, out: str | Path, setup: Setup, resume: bool = False, progress: bool = True) -> dict:
    """Run (or resume) one training run in `out`; returns the summary."""
    rd = RunDir(out, create=False)
    if resume:
        finished = completed_summary(rd, config)
        if finished is not None:
            say(f"{rd.root} already finished {finished['steps_done']}/{config.steps} steps; nothing to do "
                f"(raise `steps` to continue it)", progress)
            return finished
    elif rd.holds_run():
        raise FileExistsError(f"{rd.root} already holds a run: use --resume or another --out")
    make_env = env_factory(config)  # bad env settings fail here, before anything is written
    created = not rd.root.exists()
    timers = Timers()
    try:
        rd.create()
        rd.write_config(config)  # a resume with overrides (`--resume RUN steps=100`) records what it runs
        algorithm, start = setup(rd, config, make_env, timers, resume, progress)
    except BaseException:
        if created and not resume:  # a failed start leaves no half-made run dir
            shutil.rmtree(rd.root, ignore_errors=True)
        raise
    policy = algorithm.policy
    evals = RunEvals(rd, config, policy, make_env, timers)

    def checkpoint(step: int) -> None:
        rd.save_checkpoint(policy, step, {"algo": config.algo}, config.keep_checkpoints,
                           extra_files=algorithm.checkpoint_files())

    if resume:
        say(f"resuming {rd.root} at {algorithm.unit} {start}/{config.steps}", progress)
    line = f"{algorithm.unit} {start}/{config.steps}"
    if evals.held_out_due(start):  # the base; a resumed run's only when due there (a final eval killed midway)
        first = evals.held_out_at(start)
        line = f"eval @ {start}: success {first['success_rate']:.3f} reward {first['mean_reward']:.3f}"
    say(f"{line}{evals.curve_at(start)}", progress)
    t_start, interrupted, done = time.perf_counter(), False, start
    bar = progress_bar(config.steps, f"{algorithm.unit}s", initial=start) if progress else None
    try:
        for step in range(start, config.steps):
            t_step = time.perf_counter()
            row = algorithm.step(step)
            done = step + 1
            row["seconds"] = time.perf_counter() - t_step
            row["peak_memory_bytes"] = peak_memory_bytes(policy.device)
            rd.log(done, "train", row)
            # saved before the evals: a run killed during a long held-out eval resumes at its eval, not steps back
            if done % config.checkpoint_every == 0 or done == config.steps:
                checkpoint(done)
            curve = evals.curve_at(done)  # the cheap validation point is logged before the held-out eval
            line = (f"{algorithm.unit} {done}/{config.steps} | reward mean {row['reward_mean']:.3f} "
                    f"max {row['reward_max']:.3f}{algorithm.describe(row)}")
            if evals.held_out_due(done):
                line += f" | eval success {evals.held_out_at(done)['success_rate']:.3f}"
            line += f"{curve} | {row['seconds']:.1f}s | peak {fmt_bytes(row['peak_memory_bytes'])}"
            if done % config.log_every == 0 or done == config.steps or evals.held_out_due(done):
                say(line, progress)
            if bar:
                bar.update(1)
    except KeyboardInterrupt:
        interrupted = True
        done = algorithm.steps_done  # a Ctrl-C right after an update still counts that step
        checkpoint(done)
        say(f"interrupted: saved {algorithm.unit} {done}; resume with `esopt train --resume {rd.root}`", progress)
    finally:
        if bar:
            bar.close()
        algorithm.close()  # worker processes, clusters
    return finish(rd, algorithm, config, timers, evals.held_out, start, done, time.perf_counter() - t_start,
                  interrupted, progress)


class RunEvals:
    """A run's evals, each logged to its run dir: the held-out ones and the validation learning curve
    (`eval.curve_every`). A step already logged (a resumed run's) is not evaluated again."""

    def __init__(self, rd: RunDir, config: BaseTrainConfig, policy: Engine, make_env: Callable, timers: Timers):
        self.rd, self.config, self.policy, self.make_env, self.timers = rd, config, policy, make_env, timers
        self.spec = rollout_spec(config, make_env)
        self.curve = curve_config(config)
        logged = rd.metrics()
        self.held_out = {r["step"]: r for r in logged if r["kind"] == "eval"}
        self.curve_steps = {r["step"] for r in logged if r["kind"] == "curve"}

    def _run(self, step: int, which: BaseTrainConfig, kind: str) -> dict:
        t = time.perf_counter()

        def compute() -> dict:
            return evaluate(self.policy, which, self.spec, self.make_env)

        # the starting model's: shared by every run of a sweep with the same base (eval.base_cache)
        result = cached_base_eval(which, compute) if step == 0 else compute()
        self.timers.eval += time.perf_counter() - t
        self.rd.log(step, kind, result)
        return result

    def held_out_due(self, step: int) -> bool:
        """The held-out eval's schedule: the base, every `eval.every` steps (0: never between) and the last step."""
        every = self.config.eval.every
        return step in (0, self.config.steps) or bool(every and step % every == 0)

    def held_out_at(self, step: int) -> dict:
        if step not in self.held_out:
            self.held_out[step] = self._run(step, self.config, "eval")
        return self.held_out[step]

    def curve_at(self, step: int) -> str:
        """The learning curve's validation eval at `step`, if one is due and not logged yet: its log fragment."""
        if self.curve is None or step % self.config.eval.curve_every or step in self.curve_steps:
            return ""
        self.curve_steps.add(step)
        return f" | validation {self._run(step, self.curve, 'curve')['success_rate']:.3f}"


def completed_summary(rd: RunDir, config: BaseTrainConfig) -> dict | None:
    """The summary of a run that already did all `config.steps` steps (resuming it must change nothing)."""
    summary = read_summary(rd)
    if summary and not summary.get("interrupted") and summary.get("steps_done", -1) >= config.steps:
        return summary
    return None


def finish(rd: RunDir, algorithm: Algorithm, config: BaseTrainConfig, timers: Timers, evals: dict, start: int,
           done: int, seconds: float, interrupted: bool, progress: bool) -> dict:
    """Final artefacts: final/ weights, plots, memory ratio, summary.json and the closing line."""
    policy = algorithm.policy
    # a resumed run's steps ran in several processes: its peak and time per step come from every step's row
    logged = rd.metrics()
    peak = max([peak_memory_bytes(policy.device), *(r.get("peak_memory_bytes", 0) for r in logged
                                                     if r["kind"] == "train")])
    run_seconds = sum(r.get("seconds", 0.0) for r in logged if r["kind"] == "train") + sum(
        r.get("eval_seconds", 0.0) for r in logged if r["kind"] in ("eval", "curve") and r["step"] > 0)
    episodes = max(config.rollout_batch_size, config.eval.tasks * config.eval.repeats)
    if config.max_batch_size:  # no generate call holds more rows: a larger probe costs minutes, not memory
        episodes = min(episodes, config.max_batch_size)
    infer = inference_peak_bytes(config, episodes) if config.measure_inference_peak and not interrupted else None
    first, last = (evals[min(evals)], evals[max(evals)]) if evals else (None, None)
    summary = {
        "algo": config.algo, "steps_done": done, "steps": config.steps, "interrupted": interrupted,
        "seconds": seconds,  # this process's
        "seconds_per_step": run_seconds / max(done, 1),  # training and evals after the base, every process's
        "time_split": {"perturb": timers.perturb, "restore": timers.restore, "update": timers.update,
                       "rollout": timers.rollout, "eval": timers.eval,
                       **algorithm.time_shares(timers)},
        "parameters": sum(p.numel() for p in policy.model.parameters()),
        "peak_memory_bytes": peak, "inference_peak_bytes": infer,
        "memory_ratio": peak / infer if infer else None,
        "eval_before": first, "eval_after": last,
    }
    if not interrupted:
        rd.save_final(policy, summary, algorithm.final_files())
    rd.plot()
    rd.close()
    ratio = f"{summary['memory_ratio']:.3f}" if summary["memory_ratio"] else "n/a"
    tail = (f"{seconds:.0f}s | peak {fmt_bytes(peak)} ({config.algo} / inference-only = {ratio}) | "
            f"{algorithm.time_note(timers)}")
    if interrupted:
        last_step = max(evals) if evals else start
        say(f"interrupted at {algorithm.unit} {done}/{config.steps}: no final eval; last eval (@ {last_step}) success "
            f"{last['success_rate']:.3f} | {tail}" if last else f"interrupted at {done}/{config.steps} | {tail}",
            progress)
    elif first and last:
        say(f"done: eval success {first['success_rate']:.3f} -> {last['success_rate']:.3f}, reward "
            f"{first['mean_reward']:.3f} -> {last['mean_reward']:.3f} | {tail}", progress)
    return summary
