"""agentic-esopt: fine-tune LLM agents with evolution strategies. `ESTrainer` and `ESConfig` (TRL's shape) load on
first use, so `import esopt` stays light."""

from __future__ import annotations

from typing import Any

__all__ = ["ESConfig", "ESTrainer"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from esopt.train import es_trainer

        return getattr(es_trainer, name)
    raise AttributeError(f"module 'esopt' has no attribute {name!r}")
