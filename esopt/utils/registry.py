"""Registries by name: a table maps a name to an object or to "module:attr", imported on first use. An import
error of a registered module is raised as it is, never turned into "unknown name"."""

from __future__ import annotations

import importlib
from typing import Any


def lookup(table: dict[str, Any], name: str, what: str) -> Any:
    """table[name], importing "module:attr" entries (and caching the object in the table)."""
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; registered: {sorted(table)}")
    target = table[name]
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        target = table[name] = getattr(importlib.import_module(module), attr)
    return target
