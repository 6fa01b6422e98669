"""Named pause points, so a test can kill a run (or a worker) at a chosen moment instead of after a sleep.

Off unless the environment asks for it (one dict lookup per call otherwise):

    ESOPT_PAUSE_AT=ledger@3     # pause at the 3rd arrival at point "ledger" in a process (`ledger`: any arrival)
    ESOPT_PAUSE_DIR=/some/dir   # where the handshake files go

Every arrival at a named point is appended to DIR/NAME.log (one JSON line: pid, arrival count, the caller's
info). The first matching arrival (over all processes sharing DIR) creates DIR/NAME.reached with the same
JSON and then waits until DIR/NAME.go exists; later arrivals pass. The test waits for `.reached`, then
kills the process it names, or writes `.go` to let it continue.

Points: "rollout" (a member's rollout, weights perturbed), "ledger" (a generation's ledger line written,
before its metrics row and checkpoint), "save" (a checkpoint's or final/'s files written, not yet renamed into
place), "variance" (`esopt analyze variance`: a repetition's accumulators saved).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

_arrivals: dict[str, int] = {}


def pause_point(name: str, **info) -> None:
    spec = os.environ.get("ESOPT_PAUSE_AT")
    if not spec:
        return
    wanted = dict(part.partition("@")[::2] for part in spec.split(","))
    if name not in wanted:
        return
    _arrivals[name] = count = _arrivals.get(name, 0) + 1
    where = Path(os.environ.get("ESOPT_PAUSE_DIR", "."))
    line = json.dumps({"pid": os.getpid(), "arrival": count, **info})
    with open(where / f"{name}.log", "a", encoding="utf-8") as f:
        f.write(line + "\n")
    if wanted[name] and int(wanted[name]) != count:
        return
    tmp = where / f".{name}.{os.getpid()}.{count}"
    tmp.write_text(line, encoding="utf-8")
    try:
        os.link(tmp, where / f"{name}.reached")  # atomic and exclusive: the file appears whole, once
    except FileExistsError:  # another arrival paused first: this one passes
        return
    finally:
        tmp.unlink()
    go = where / f"{name}.go"
    while not go.exists():  # a handshake with the test, which kills this process or writes `go`
        time.sleep(0.01)
