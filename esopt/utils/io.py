"""Atomic file and checkpoint writes: a crash leaves the old file or the new one, never half of one."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from esopt.utils.faults import pause_point


def write_text_atomic(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json_atomic(path: str | Path, data) -> None:
    write_text_atomic(path, json.dumps(data, indent=2))


def save_pretrained_atomic(model, tokenizer, out: str | Path, extra_files: dict | None = None) -> Path:
    """save_pretrained into a temp dir beside `out`, then rename it into place (HF-loadable dir).

    extra_files maps a file name to its text, its bytes, or a function that writes it given the path.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp"))
    os.chmod(tmp, 0o755)  # mkdtemp creates 0700; a checkpoint should be readable like any saved model
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for name, content in (extra_files or {}).items():
            if callable(content):
                content(tmp / name)
            elif isinstance(content, bytes):
                (tmp / name).write_bytes(content)
            else:
                (tmp / name).write_text(content, encoding="utf-8")
        pause_point("save", path=str(out))  # tests: kill with the files written, not yet renamed into place
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def cache_dir() -> Path:
    """Where built models are cached: $ESOPT_CACHE, else ~/.cache/esopt."""
    return Path(os.environ.get("ESOPT_CACHE") or Path.home() / ".cache" / "esopt").expanduser()
