"""Defer Ctrl-C across a critical section (a weight update must not stop half-applied)."""

from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def defer_sigint():
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda *a: received.append(a))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            raise KeyboardInterrupt
