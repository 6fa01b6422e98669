"""The seed ledger: one JSON line per generation in history.jsonl, enough to rebuild the weights.

A line holds the generation, member seeds and signs, raw rewards, shaped weights, alpha, sigma, scope
and noise-spec version. `replay(base_model, history)` re-applies every update to the base weights; with
the same device type and fp32 it is bit-exact with the trained weights (exact-restore runs).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable
from pathlib import Path

import torch

from esopt.es.perturbation import apply_record, build_perturbation
from esopt.es.scope import ParamScope, select_parameters


class Ledger:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: dict) -> None:
        """Append one line and fsync it: a generation is either fully recorded or not at all."""
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def truncate(self, generations: int) -> None:
        """Keep the first `generations` complete lines (drops a torn last line too), atomically."""
        keep = read_history(self.path)[:generations] if self.path.exists() else []
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in keep), encoding="utf-8")
        os.replace(tmp, self.path)


def read_history(path: str | Path) -> list[dict]:
    """Parse history.jsonl; a torn last line (a run killed mid-write) is ignored with a warning."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no ledger at {path}")
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                warnings.warn(f"{path}: ignoring a torn last line (interrupted write)", stacklevel=2)
                break
            raise ValueError(f"{path}: line {i + 1} is not valid JSON") from None
    for i, r in enumerate(records):
        if r.get("generation") != i:
            raise ValueError(f"{path}: line {i + 1} has generation {r.get('generation')}, expected {i}")
    return records


def replay(model: torch.nn.Module, history: str | Path | Iterable[dict], upto: int | None = None) -> torch.nn.Module:
    """Rebuild trained weights in place from the base `model` and the ledger (first `upto` generations)."""
    records = read_history(history) if isinstance(history, (str, Path)) else list(history)
    records = records[:upto]
    if not records:
        return model
    first = records[0]
    for r in records:
        if r["noise"] != first["noise"] or r["scope"] != first["scope"]:
            raise ValueError(f"generation {r['generation']} changed the noise spec or scope mid-run; "
                             "a ledger replays with one")
    params = select_parameters(model, ParamScope(**first["scope"]))
    # An exact-restore run updated an fp32 master; replay does the same so bf16 models match too.
    perturbation = build_perturbation(params, first["noise"], restore=first["restore"])
    for r in records:
        apply_record(perturbation, r)
    return model
