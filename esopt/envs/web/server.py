"""The app server's lifecycle: one child process per world seed, shared by every env of this process.

`acquire(data_seed)` starts the server on first use (`python -m esopt.envs.web.server`) and counts its users;
`release()` of the last user stops it (at once, or after `linger` seconds without a new user, so back-to-back
rollouts reuse one server). The child binds a free loopback port before it prints it, so the parent's first
request cannot race the listen. It exits when its stdin closes, and only the parent holds the write end: when
the parent dies, by any signal, the kernel closes the pipe and the server goes with it. No polling, no sleeps.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any

START_TIMEOUT = 60.0


@dataclass
class Server:
    data_seed: int
    process: subprocess.Popen
    port: int
    users: int = 0
    timer: threading.Timer | None = field(default=None, repr=False)
    log: Any = field(default=None, repr=False)  # the child's stderr (a temporary file)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()  # the child's signal to exit
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        elif self.process.stdin and not self.process.stdin.closed:
            self.process.stdin.close()
        for stream in (self.process.stdout, self.log):
            if stream is not None and not stream.closed:
                stream.close()


_LOCK = threading.Lock()
_SERVERS: dict[int, Server] = {}


def _spawn(data_seed: int) -> Server:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    errors = tempfile.TemporaryFile()  # a file, not a pipe: a chatty server can never block on a full pipe
    process = subprocess.Popen(
        [sys.executable, "-m", "esopt.envs.web.server", str(data_seed)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=errors,
        env=env,
        close_fds=True,
    )
    timer = threading.Timer(START_TIMEOUT, process.kill)  # a child that never reports its port is killed
    timer.start()
    line = process.stdout.readline().decode(errors="replace").strip()
    timer.cancel()
    if not line.startswith("port "):
        process.kill()
        process.wait()
        errors.seek(0)
        err = errors.read().decode(errors="replace").strip().splitlines()
        for stream in (errors, process.stdin, process.stdout):
            stream.close()
        raise RuntimeError(f"web app server did not start: {err[-1] if err else line or 'no output'}")
    return Server(data_seed, process, int(line.split()[1]), log=errors)


def acquire(data_seed: int = 0) -> Server:
    """The running server of world `data_seed`, started if needed; each call must be paired with `release`."""
    with _LOCK:
        server = _SERVERS.get(data_seed)
        if server is not None and server.process.poll() is not None:  # died under us (killed): start afresh
            server.stop()
            server = None
        if server is None:
            server = _SERVERS[data_seed] = _spawn(data_seed)
        if server.timer is not None:
            server.timer.cancel()
            server.timer = None
        server.users += 1
        return server


def release(server: Server, linger: float = 0.0) -> None:
    """One user less; the last one stops the server, after `linger` seconds unless a new user comes."""
    with _LOCK:
        server.users = max(0, server.users - 1)
        if server.users > 0:
            return
        if linger <= 0:
            _stop(server)
        else:
            server.timer = threading.Timer(linger, _stop_if_idle, args=(server,))
            server.timer.daemon = True
            server.timer.start()


def _stop_if_idle(server: Server) -> None:
    with _LOCK:
        if server.users == 0:
            _stop(server)


def _stop(server: Server) -> None:
    if _SERVERS.get(server.data_seed) is server:
        del _SERVERS[server.data_seed]
    server.stop()


@atexit.register
def stop_all() -> None:
    """Stop every server of this process (at interpreter exit; also for tests)."""
    with _LOCK:
        for server in list(_SERVERS.values()):
            _stop(server)


def running() -> list[Server]:
    with _LOCK:
        return list(_SERVERS.values())


def _watch_stdin() -> None:
    sys.stdin.buffer.read()  # returns at EOF: the parent closed the pipe or died
    os._exit(0)


def main(argv: list[str]) -> None:
    import uvicorn

    from esopt.envs.web.app import make_app

    data_seed = int(argv[0]) if argv else 0
    app = make_app(data_seed)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # accepted sockets inherit it: no 40 ms Nagle stalls
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    threading.Thread(target=_watch_stdin, daemon=True).start()
    print(f"port {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", ws="none")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main(sys.argv[1:])
