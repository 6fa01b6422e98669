"""The `process` sandbox backend: model-written Python in a contained child process, without namespaces
of mounts or processes. Weaker than `bwrap` (esopt.sandbox.bwrap), the default: use it only where bubblewrap
cannot run, by name (`backend="process"`; the math env's `sandbox: process`).

Layers, each on its own enough for the common failure and together a defence in depth:
- a separate process in its own session (`python -I`: no `PYTHON*` variables, no user site), killed with its
  whole process group at the wall-clock timeout;
- an environment of its own: the parent's variables never reach it (only PATH, HOME=TMP and thread caps);
- a fresh temporary working directory, deleted afterwards;
- resource limits: CPU seconds, address space (memory), size of any written file (which also caps the
  output, written to files), open files, and no core dumps;
- where the kernel allows (root, or unprivileged user namespaces): a new, empty network namespace;
- when running as root, and only if the Python installation is readable by everyone: the uid/gid of `nobody`,
  so process-count limits apply and the host's files are read-only (a pyenv Python under /root is not, so
  there the child keeps root's uid, and the audit hook below is what keeps it in its directory);
- a Python audit hook installed before the code runs, which refuses sockets, new processes (fork, exec,
  spawn, subprocess, os.system), signals to other processes, ctypes loading, leaving the working directory,
  writes outside it, opening directories outside it, and reads of other processes' `/proc` entries.

This contains accidents and ordinary model mistakes (infinite loops, memory and fork bombs, stray writes,
network calls). It is not a boundary against a determined attacker: the audit hook lives in the same
interpreter as the code it watches (code that reaches the bootstrap's state disables it), reads of the host's
files are not contained, and there is no disk quota (only each file's size is capped).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time

from esopt.sandbox.result import SandboxResult, read_limited, wait_then_kill_group

NOBODY = 65534

# Runs in the child before the user's code: limits, namespaces, privilege drop, then the audit hook.
_BOOTSTRAP = r'''
import os, sys, resource
root, mem, cpu, fsize, nproc, drop = sys.argv[1], *map(int, sys.argv[2:7])
os.chdir(root)
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
layers = []
try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    flags = 0x40000000 if os.geteuid() == 0 else 0x40000000 | 0x10000000  # CLONE_NEWNET (| CLONE_NEWUSER)
    if libc.unshare(flags) == 0:
        layers.append("netns")
    del libc
except Exception:
    pass
if os.geteuid() == 0 and drop:
    os.setgroups([])
    os.setgid(%(nobody)d)
    os.setuid(%(nobody)d)
    layers.append("nobody")
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
with open(os.path.join(root, ".layers"), "w") as f:
    f.write(",".join(layers))
ROOT = os.path.realpath(root)
PID = str(os.getpid())
BLOCKED = ("socket.", "subprocess.", "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system",
           "os.kill", "os.killpg", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function", "os.startfile")
PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink", "os.link",
               "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile")
WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
def resolve(path):
    # relative paths resolve against ROOT: the working directory never leaves it (chdir is refused) and no
    # directory outside it can be opened, so no dir_fd points elsewhere and ROOT is the deepest ancestor
    if isinstance(path, bytes):
        path = path.decode(errors="replace")
    return os.path.realpath(os.path.join(ROOT, str(path)))
def inside(path):
    if isinstance(path, int):
        return True
    full = resolve(path)
    return full == ROOT or full.startswith(ROOT + os.sep)
def hook(event, args):
    if event.startswith(BLOCKED):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "import" and args[0] in ("_posixsubprocess", "_ctypes", "_socket"):
        raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
    if event == "os.chdir":
        if isinstance(args[0], int) or not inside(args[0]):
            raise PermissionError("sandbox: the working directory cannot change")
    elif event == "open":
        path, mode, flags = args
        writes = (mode is not None and any(c in str(mode) for c in "wax+")) or bool((flags or 0) & WRITE)
        if writes and not inside(path):
            raise PermissionError(f"sandbox: writing outside the working directory ({path})")
        if isinstance(path, (str, bytes)):
            full = resolve(path)
            parts = full.split(os.sep)
            if full == "/proc" or (len(parts) > 2 and parts[1] == "proc" and parts[2].isdigit() and parts[2] != PID):
                raise PermissionError("sandbox: other processes are not visible")
            if not inside(path) and os.path.isdir(full):
                raise PermissionError("sandbox: directories outside the working directory cannot be opened")
    elif event in PATH_EVENTS:
        for a in args:
            if isinstance(a, (str, bytes)) and not inside(a):
                raise PermissionError(f"sandbox: {event} outside the working directory")
import subprocess, _posixsubprocess  # loaded now, so a later import of either raises no audit event...
def _no_fork_exec(*args, **kwargs):
    raise PermissionError("sandbox: new processes are not allowed")
_posixsubprocess.fork_exec = subprocess._fork_exec = _no_fork_exec  # reloading the original is refused below
sys.addaudithook(hook)
del hook
with open("main.py") as f:
    source = f.read()
code = compile(source, "<python>", "exec")
del source
sys.argv = ["<python>"]
exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
'''


def run_python(code: str, *, timeout: float = 5.0, cpu_seconds: int = 5, memory_mb: int = 512,
               max_output_bytes: int = 64_000, max_processes: int = 64, disk_mb: int | None = None) -> SandboxResult:
    """Run `code` in a contained child (see the module doc) and return its truncated output. `disk_mb` is
    accepted for a common signature and not enforced: this backend has no disk quota."""
    if not isinstance(code, str):
        raise TypeError("code must be a string")
    tmp = tempfile.mkdtemp(prefix="esopt-py-")
    start = time.perf_counter()
    try:
        with open(os.path.join(tmp, "main.py"), "w") as f:
            f.write(code)
        os.chmod(tmp, 0o777)  # `nobody` writes here when the parent is root
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
               "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        bootstrap = _BOOTSTRAP % {"nobody": NOBODY}
        args = [sys.executable, "-I", "-c", bootstrap, tmp, str(memory_mb * 2**20), str(cpu_seconds),
                str(max_output_bytes), str(max_processes), str(int(_python_world_readable()))]
        with open(os.path.join(tmp, ".stdout"), "wb") as out, open(os.path.join(tmp, ".stderr"), "wb") as err:
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=tmp,
                                    start_new_session=True, close_fds=True)
            timed_out = wait_then_kill_group(proc, timeout)
        stdout, stderr = (read_limited(os.path.join(tmp, name), max_output_bytes) for name in (".stdout", ".stderr"))
        layers_path = os.path.join(tmp, ".layers")
        layers = read_limited(layers_path, 200).split(",") if os.path.exists(layers_path) else []
        full = os.path.getsize(os.path.join(tmp, ".stdout")) >= max_output_bytes
        return SandboxResult(stdout, stderr, proc.returncode, timed_out, time.perf_counter() - start,
                             ["process", "env", "tmpdir", "rlimits", *[x for x in layers if x], "audit"], full)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@functools.lru_cache(maxsize=1)  # the installation does not change while we run: walk it once
def _python_world_readable() -> bool:
    """Whether `nobody` could run this Python: its stdlib and site-packages, and every folder above them,
    readable by others. (A pyenv Python under /root is not: then the child keeps root's uid, and the audit
    hook alone refuses new processes.)"""
    import sysconfig

    for top in {os.path.dirname(os.__file__), sysconfig.get_paths()["purelib"]}:
        path = os.path.realpath(top)
        while True:
            try:
                if os.stat(path).st_mode & 0o005 != 0o005:
                    return False
            except OSError:
                return False
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
    return True
