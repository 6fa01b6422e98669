"""The run directory: config.yaml, history.jsonl, metrics.jsonl, tb/, plots/, checkpoints/, final/,
summary.json. Every file name of a run is spelled here and nowhere else."""

from __future__ import annotations

import importlib.util
import json
import shutil
import time
from pathlib import Path

from esopt.engines.base import Engine
from esopt.train.config import BaseTrainConfig, ConfigError, dump_config
from esopt.utils.io import save_pretrained_atomic, write_json_atomic, write_text_atomic


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
        self.tensorboard = True
        self._config: BaseTrainConfig | None = None  # the run's config once written (trackio's run gets it)
        self._trackio = None  # the trackio module once its run is open

    def create(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def holds_run(self) -> bool:
        """A run was started here (a ledger or metrics rows exist)."""
        return any(p.exists() and p.stat().st_size for p in (self.history_path, self.metrics_path))

    def write_config(self, config: BaseTrainConfig) -> None:
        dump_config(config.with_resolved_dtype(), self.config_path)
        self.tensorboard = config.tensorboard
        self._config = config
        if self.trackio_project and importlib.util.find_spec("trackio") is None:
            raise ConfigError(f"trackio_project {self.trackio_project!r}: trackio is not installed "
                              "(pip install trackio, or pip install 'agentic-esopt[trl]')")

    @property
    def tb(self):
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.root / "tb"))
        return self._tb

    @property
    def trackio_project(self) -> str | None:
        return self._config.trackio_project if self._config is not None else None

    def _trackio_run(self):
        """trackio, its run opened on first use: named after the run dir, resumed (not duplicated) by a resume."""
        if self._trackio is None:
            import trackio

            assert self._config is not None  # trackio_project comes from it
            trackio.init(project=self.trackio_project, name=self.root.resolve().name,
                         config=self._config.model_dump(mode="json"),
                         resume="allow", embed=False, auto_log_cpu=False, auto_log_gpu=False)
            self._trackio = trackio
        return self._trackio

    def log(self, step: int, kind: str, values: dict) -> None:
        row = {"step": step, "kind": kind, "time": time.time(), **values}
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        scalars = {f"{kind}/{k}": v for k, v in values.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self.tensorboard:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.trackio_project and scalars:
            self._trackio_run().log(scalars, step=step)

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
        write_text_atomic(self.metrics_path, "".join(json.dumps(r) + "\n" for r in keep))

    def save_checkpoint(self, policy: Engine, step: int, state: dict, keep: int,
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

    def save_final(self, policy: Engine, summary: dict, extra_files: dict | None = None) -> None:
        save_pretrained_atomic(policy.model, policy.tokenizer, self.root / "final", extra_files=extra_files)
        write_json_atomic(self.summary_path, summary)

    def plot(self) -> list[Path]:
        from esopt.utils.plots import plot_run

        return plot_run(self.metrics(), self.plots)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._trackio is not None:
            self._trackio.finish()
            self._trackio = None


def read_summary(rd: RunDir) -> dict | None:
    try:
        return json.loads(rd.summary_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
