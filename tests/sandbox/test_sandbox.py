"""The code sandbox (esopt.sandbox): one test per escape class against the bwrap backend, each checking the
host is unchanged afterwards; the accident tests shared by both backends; the process backend's own audit-hook
tests; the error where bwrap cannot run and the warned opt-in to the weaker backend; the math env through
bwrap. Where bwrap cannot run (tried for real), its tests skip with bwrap's reason; nothing is xfail."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
import warnings
from pathlib import Path

import pytest

import esopt
import esopt.sandbox
from esopt.envs import MATH_ID, make_env
from esopt.sandbox import SandboxUnavailable, WeakSandboxWarning, check_backend, run_python

try:
    check_backend("bwrap")
    BWRAP_ERROR = None
except SandboxUnavailable as e:  # the visible reason of every bwrap skip below
    BWRAP_ERROR = str(e)
needs_bwrap = pytest.mark.skipif(BWRAP_ERROR is not None, reason=f"bwrap cannot run here: {BWRAP_ERROR}")
BOTH = [pytest.param("bwrap", marks=needs_bwrap), "process"]
CHECKOUT = Path(esopt.__file__).resolve().parents[1]
# where the sandbox's Python comes from: (host path, path inside), so tests know what may be visible
MOUNTS = [] if BWRAP_ERROR else [m for m in esopt.sandbox.bwrap._python_mounts() if not m[0].startswith("symlink:")]
SITE = [m for m in MOUNTS if "-packages" in m[1]]
pytestmark = pytest.mark.filterwarnings("ignore::esopt.sandbox.WeakSandboxWarning")


def bwrap(code: str, **limits) -> esopt.sandbox.SandboxResult:
    return run_python(code, backend="bwrap", **limits)


def snapshot(*roots: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under `roots` with its mode and (for files) its content."""
    out = {}
    for root in roots:
        for path in [root, *root.rglob("*")]:
            st = path.lstat()
            out[str(path)] = (st.st_mode, path.read_bytes() if path.is_file() and not path.is_symlink() else None)
    return out


def host_processes_with(token: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and token.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            pass
    return found


# -- escapes, one class each, against the bwrap backend
@needs_bwrap
def test_code_that_owns_its_interpreter_still_cannot_reach_the_host(tmp_path):
    """The attack on the process backend disabled its audit hook from inside, then wrote outside and ran a
    shell as root. Inside bwrap there is no hook to disable: the code may do anything in its interpreter
    (its frames, ctypes, fork, exec) and the shell it starts runs as a uid of its own, on an empty root."""
    marker = tmp_path / "pwned"
    before = snapshot(tmp_path)
    code = f"""
import ctypes, os, subprocess, sys
frame = sys._getframe(1)                 # the bootstrap's state is the code's to change: nothing hangs on it
frame.f_globals.clear()
print("uid", os.getuid(), os.geteuid())
print("system", os.system("echo pwned > {marker}; id -u > /dev/null") != 0)
r = subprocess.run(["/bin/sh", "-c", "id -u; echo pwned > {marker}"], capture_output=True, text=True)
print("sh uid", r.stdout.split()[0], "wrote", r.returncode == 0)
libc = ctypes.CDLL(None)
print("libc system", libc.system(b"echo pwned > {marker}") != 0)
pid = os.fork()
if pid == 0:
    os.execv("/bin/sh", ["sh", "-c", "echo pwned > {marker}"])
print("exec", os.waitpid(pid, 0)[1] != 0)
libc = ctypes.CDLL(None, use_errno=True)
print("new user namespace", libc.unshare(0x10000000), ctypes.get_errno())  # seccomp: EPERM
for cap in open("/proc/self/status"):
    if cap.startswith(("CapEff", "NoNewPrivs")):
        print(cap.strip())
"""
    r = bwrap(code, timeout=20)
    out = r.stdout
    assert r.returncode == 0, r.stderr
    uid = int(out.split("uid ")[1].split()[0])
    assert uid != 0 and f"sh uid {uid} wrote False" in out  # processes run, as a uid that is not root
    assert "system True" in out and "libc system True" in out and "exec True" in out
    assert "CapEff:\t0000000000000000" in out and "NoNewPrivs:\t1" in out
    assert f"new user namespace -1 {errno.EPERM}" in out
    assert not marker.exists() and snapshot(tmp_path) == before


@needs_bwrap
def test_host_files_are_invisible(tmp_path):
    token = uuid.uuid4().hex
    secret = tmp_path / "secret.txt"
    secret.write_text(f"secret {token}")
    os.chmod(tmp_path, 0o755)
    secret.chmod(0o644)  # readable by anyone on the host: invisible all the same
    before = snapshot(tmp_path)
    paths = [secret, tmp_path, "/etc/shadow", "/etc/passwd", "/etc/hostname", "/home", CHECKOUT / "pyproject.toml",
             CHECKOUT / "esopt", CHECKOUT / ".venv" / "bin", Path.home() / ".cache", "/var", "/opt", "/srv"]
    paths = [p for p in paths if not any(dest.startswith(f"{p}/") for _, dest in MOUNTS)]  # not the Python's own
    code = f"""
import os
for p in {[str(p) for p in paths]!r}:
    try:
        print(p, "READ", open(p).read() if os.path.isfile(p) else os.listdir(p))
    except FileNotFoundError:
        print(p, "missing")
    except OSError as e:
        print(p, "refused", e.errno)
try:
    import esopt
    print("esopt importable")
except ImportError:
    print("esopt not importable")
print("root", sorted(os.listdir("/root")) if os.path.isdir("/root") else [])
print("top", sorted(os.listdir("/")))
"""
    r = bwrap(code)
    assert r.returncode == 0, r.stderr
    assert token not in r.stdout and "READ" not in r.stdout, r.stdout
    assert all(f"{p} missing" in r.stdout for p in paths), r.stdout
    assert "esopt not importable" in r.stdout
    own = {dest.split("/")[1] for _, dest in MOUNTS}  # the first folder of each path the Python needs
    under_root = {dest.split("/")[2] for _, dest in MOUNTS if dest.startswith("/root/")}
    assert set(eval(r.stdout.split("root ")[1].split("\n")[0])) <= under_root  # no home but the Python's path
    top = eval(r.stdout.split("top ")[1])
    assert set(top) <= {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp", "usr", *own}
    assert snapshot(tmp_path) == before


@needs_bwrap
def test_writes_outside_its_tmpfs_leave_the_host_unchanged(tmp_path):
    token = uuid.uuid4().hex
    target = tmp_path / "target.txt"
    target.write_text("original")
    os.chmod(tmp_path, 0o777)  # writable by anyone on the host: still out of reach
    target.chmod(0o666)
    before = snapshot(tmp_path)
    host_tmp = Path("/tmp") / f"esopt-escape-{token}"
    inside_paths = [str(target), str(tmp_path / "new.txt"), "/x", "/usr/x", "/etc/x", "/dev/x", "/dev/shm/x",
                    f"/proc/x{token}",
                    os.path.join(os.path.dirname(os.__file__), "x.py")]
    inside_paths += [f"{dest}/x.pth" for _, dest in SITE]
    code = f"""
import os
for p in {inside_paths!r}:
    try:
        open(p, "w").write("x")
        print(p, "WROTE")
    except OSError as e:
        print(p, "refused", e.errno)
for call in (lambda: os.remove({str(target)!r}), lambda: os.rename("/usr", "/usr2"), lambda: os.chmod("/usr", 0o777)):
    try:
        call()
        print("CHANGED")
    except OSError as e:
        print("refused", e.errno)
open({str(host_tmp)!r}, "w").write("in the sandbox's own /tmp")
open("cwd.txt", "w").write("ok")
print("cwd", os.getcwd(), open("cwd.txt").read(), os.path.exists({str(host_tmp)!r}))
skip = ("/proc", "/dev/pts", "/usr", *{[dest for _, dest in MOUNTS]!r})  # procfs, devpts, read-only binds
writable = []
for d, subdirs, _ in os.walk("/"):
    subdirs[:] = [x for x in subdirs if not os.path.join(d, x).startswith(skip)]
    if os.access(d, os.W_OK):
        writable.append(d)
print("writable", writable)
"""
    r = bwrap(code, timeout=20)
    assert r.returncode == 0, r.stderr
    assert "WROTE" not in r.stdout and "CHANGED" not in r.stdout, r.stdout
    assert "cwd /tmp ok True" in r.stdout  # its own tmpfs is writable, and gone afterwards
    assert "writable ['/tmp']" in r.stdout  # and it is the only writable folder
    assert not host_tmp.exists()
    assert snapshot(tmp_path) == before and target.read_text() == "original"
    assert not (Path(os.path.dirname(os.__file__)) / "x.py").exists()
    assert not any((Path(src) / "x.pth").exists() for src, _ in SITE)


@needs_bwrap
def test_processes_it_starts_stay_inside(tmp_path):
    """Policy: processes may start inside (up to max_processes); they share the sandbox's view and uid, can
    signal nothing on the host, and die with the sandbox when the call ends (no stragglers)."""
    canary = subprocess.Popen(["sleep", "60"])
    token = uuid.uuid4().hex
    marker = tmp_path / "pwned"
    try:
        code = f"""
import os, signal, subprocess
r = subprocess.run(["/bin/sh", "-c", "echo pwned > {marker}; kill -9 {canary.pid}"],
                   capture_output=True, text=True)
print("sh", r.returncode)
for pid in ({canary.pid}, {os.getpid()}):
    try:
        os.kill(pid, signal.SIGKILL)
        print("KILLED", pid)
    except ProcessLookupError:
        print("no such process", pid)
    except PermissionError:
        print("refused", pid)
subprocess.Popen(["/bin/sh", "-c", "sleep 300; echo {token}"], start_new_session=True)  # left behind
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
"""
        r = bwrap(code, timeout=20)
        assert r.returncode == 0, r.stderr
        assert "sh " in r.stdout and "KILLED" not in r.stdout, r.stdout
        inside = eval(r.stdout.split("pids ")[1])
        assert max(inside) < 100  # a pid namespace of its own: only its few processes
        assert canary.poll() is None and not marker.exists()
        deadline = time.monotonic() + 5
        while host_processes_with(token) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_processes_with(token) == []  # the straggler died with the sandbox
    finally:
        canary.kill()
        canary.wait()


@needs_bwrap
def test_no_socket_reaches_the_host():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(0.5)
    abstract = socket.socket(socket.AF_UNIX)
    name = f"\0esopt-test-{uuid.uuid4().hex}"
    abstract.bind(name)
    abstract.listen(8)
    abstract.settimeout(0.5)
    accepted = []

    def serve(sock):
        try:
            accepted.append(sock.accept())
        except OSError:
            pass

    try:
        code = f"""
import socket
tries = [("tcp", socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", {port})),
         ("tcp6", socket.AF_INET6, socket.SOCK_STREAM, ("::1", {port})),
         ("abstract", socket.AF_UNIX, socket.SOCK_STREAM, {name!r})]
for what, family, kind, address in tries:
    s = socket.socket(family, kind)
    s.settimeout(2)
    try:
        s.connect(address)
        print(what, "CONNECTED")
    except OSError as e:
        print(what, "failed", e.errno)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    u.sendto(b"hello", ("127.0.0.1", {udp.getsockname()[1]}))
    print("udp sent")
except OSError as e:
    print("udp failed", e.errno)
print("interfaces", [n for _, n in socket.if_nameindex()])
"""
        r = bwrap(code, timeout=20)
        threads = [threading.Thread(target=serve, args=(s,)) for s in (server, abstract)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        try:
            got = udp.recv(100)
        except OSError:
            got = None
        assert r.returncode == 0, r.stderr
        assert "CONNECTED" not in r.stdout and accepted == [] and got is None, r.stdout
        assert "interfaces ['lo']" in r.stdout
    finally:
        for s in (server, udp, abstract):
            s.close()


@needs_bwrap
def test_filling_the_disk_stops_at_the_tmpfs_size():
    """The reported attack: 3,000 files of 60 kB (180 MB). Here the tmpfs holds 16 MB, then writes fail."""
    free = shutil.disk_usage("/tmp").free
    code = """
import os
written = 0
try:
    for i in range(3000):
        with open(f"f{i}", "wb") as f:
            f.write(b"x" * 60_000)
        written += 60_000
    print("ALL", written)
except OSError as e:
    print("stopped", written, e.errno)
"""
    r = bwrap(code, disk_mb=16, max_output_bytes=64_000, timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("stopped") and int(r.stdout.split()[2]) == errno.ENOSPC, r.stdout
    assert int(r.stdout.split()[1]) <= 16 * 2**20
    assert shutil.disk_usage("/tmp").free > free - 100 * 2**20  # the host disk took none of it (slack for others)
    assert bwrap("import os; print(os.listdir('.'))").stdout.strip() == "[]"  # and the next call starts empty


@needs_bwrap
def test_a_fork_bomb_is_capped_by_the_process_limit():
    counted = bwrap("""
import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as e:
    print(n, e.errno)
""", max_processes=16, timeout=20)
    n, err = map(int, counted.stdout.split())
    assert n < 16 and err == errno.EAGAIN
    start = time.monotonic()
    r = bwrap("import os\nwhile True: os.fork()", max_processes=16, timeout=10)
    assert r.returncode != 0 and time.monotonic() - start < 15
    assert subprocess.run(["true"]).returncode == 0  # the host still forks


@needs_bwrap
def test_a_memory_bomb_is_capped():
    for code in ("a = []\nwhile True: a.append(' ' * 10**7)", "b = bytearray(8 * 2**30)"):
        r = bwrap(code, memory_mb=256, timeout=20)
        assert r.returncode != 0 and "MemoryError" in r.observation(500)
    assert bwrap("print(6 * 7)").stdout.strip() == "42"


@needs_bwrap
def test_an_infinite_loop_is_stopped_by_the_cpu_limit_and_the_wall_clock():
    r = bwrap("while True: pass", timeout=20, cpu_seconds=1)
    assert r.signal_name == "SIGXCPU" and "CPU time limit" in r.observation(500) and r.seconds < 15
    r = bwrap("import os\nif os.fork() == 0:\n    while True: pass\nos.wait()", timeout=20, cpu_seconds=1)
    assert r.seconds < 15  # a busy child is capped as well
    r = bwrap("import time\nwhile True: time.sleep(1)", timeout=1)
    assert r.timed_out and "wall-clock" in r.observation(500) and r.seconds < 10


@needs_bwrap
def test_signals_do_not_reach_the_parent():
    canary = subprocess.Popen(["sleep", "60"])
    try:
        code = f"""
import os, signal
for what, call in [("parent", lambda: os.kill(os.getppid(), signal.SIGKILL)),
                   ("test process", lambda: os.kill({os.getpid()}, signal.SIGKILL)),
                   ("canary", lambda: os.kill({canary.pid}, signal.SIGKILL)),
                   ("group", lambda: os.killpg({os.getpgid(0)}, signal.SIGKILL)),
                   ("everyone", lambda: os.kill(-1, signal.SIGKILL))]:
    try:
        call()
        print(what, "sent")
    except OSError as e:
        print(what, "failed", e.errno)
"""
        r = bwrap(code)
        assert "test process failed" in r.stdout and "canary failed" in r.stdout, r.stdout
        assert canary.poll() is None  # and this process is still here to check
    finally:
        canary.kill()
        canary.wait()


@needs_bwrap
def test_the_parents_environment_is_invisible(monkeypatch):
    monkeypatch.setenv("ESOPT_TEST_SECRET", "hunter2")
    code = f"""
import os
print(dict(os.environ))
for pid in [p for p in os.listdir("/proc") if p.isdigit()] + ["{os.getpid()}", "{os.getppid()}"]:
    try:
        print(pid, open(f"/proc/{{pid}}/environ").read())
    except OSError as e:
        print(pid, "refused", e.errno)
"""
    r = bwrap(code)
    assert r.returncode == 0, r.stderr
    assert "hunter2" not in r.stdout + r.stderr and "ESOPT_TEST_SECRET" not in r.stdout
    assert f"{os.getpid()} refused" in r.stdout


# -- accidents, both backends
@pytest.mark.parametrize("backend", BOTH)
def test_stops_an_infinite_loop(backend):
    r = run_python("while True: pass", timeout=10, cpu_seconds=1, backend=backend)
    assert r.returncode != 0 and "time limit" in r.observation(500) and r.seconds < 9


@pytest.mark.parametrize("backend", BOTH)
def test_stops_a_sleeper_at_the_wall_clock(backend):
    r = run_python("import time; time.sleep(60)", timeout=1, backend=backend)
    assert r.timed_out and "wall-clock" in r.observation(500)


@pytest.mark.parametrize("backend", BOTH)
def test_contains_a_memory_bomb(backend):
    r = run_python("a = []\nwhile True: a.append(' ' * 10**7)", timeout=10, memory_mb=256, backend=backend)
    assert r.returncode != 0 and "MemoryError" in r.observation(500)


@pytest.mark.parametrize("backend", BOTH)
def test_contains_a_fork_bomb(backend):
    r = run_python("import os\nwhile True: os.fork()", timeout=5, max_processes=16, backend=backend)
    assert r.returncode != 0
    assert run_python("print(6 * 7)", backend=backend).stdout.strip() == "42"  # the host is fine afterwards


@pytest.mark.parametrize("backend", BOTH)
def test_refuses_writes_outside_its_directory(backend, tmp_path):
    target = tmp_path / "escaped.txt"
    r = run_python(f"open({str(target)!r}, 'w').write('x')", timeout=5, backend=backend)
    assert r.returncode != 0 and not target.exists()
    ok = run_python("open('inside.txt', 'w').write('ok'); print(open('inside.txt').read())", backend=backend)
    assert ok.stdout.strip() == "ok"


@pytest.mark.parametrize("backend", BOTH)
def test_has_no_network(backend):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        r = run_python(f"import socket; s = socket.socket(); s.connect(('127.0.0.1', {port})); print('connected')",
                       timeout=5, backend=backend)
        assert "connected" not in r.stdout and r.returncode != 0
    finally:
        server.close()


@pytest.mark.parametrize("backend", BOTH)
def test_cannot_read_the_parents_environment(backend, monkeypatch):
    monkeypatch.setenv("ESOPT_TEST_SECRET", "hunter2")
    r = run_python("import os\nprint(dict(os.environ))\nprint(open(f'/proc/{os.getppid()}/environ').read())",
                   timeout=5, backend=backend)
    assert "hunter2" not in r.stdout + r.stderr
    assert "ESOPT_TEST_SECRET" not in r.stdout
    assert run_python("print(6 * 7)", backend=backend).stdout.strip() == "42"


@pytest.mark.parametrize("backend", BOTH)
def test_output_and_errors_read_the_same(backend):
    assert run_python("print(sum(range(10)))", backend=backend).observation(100) == "45"
    assert run_python("1/0", backend=backend).observation(500).splitlines()[-1] == "ZeroDivisionError: division by zero"
    r = run_python("print('y' * 5000)", max_output_bytes=100, backend=backend)
    assert len(r.observation(100)) <= 100 and "truncated" in r.observation(100)
    assert run_python("import sys; sys.exit(3)", backend=backend).returncode == 3


# -- the process backend's own layer: the audit hook keeps code in its directory
def test_process_backend_keeps_code_in_its_directory():
    escapes = {
        "chdir": "import os; os.chdir('/'); open('x', 'w')",
        "dir fd": "import os; fd = os.open('/proc', 0); os.open(f'{os.getppid()}/environ', 0, dir_fd=fd)",
        "relative to a deeper fd": ("import os; os.makedirs('a/b'); fd = os.open('a/b', 0)\n"
                                    "open('../../../x', 'w', opener=lambda p, f: os.open(p, f, dir_fd=fd))"),
        "private fork_exec": "import subprocess; subprocess._fork_exec(*([None] * 23))",
    }
    for what, code in escapes.items():
        r = run_python(code, timeout=5, backend="process")
        assert r.returncode != 0 and "PermissionError: sandbox" in r.observation(500), what
    r = run_python("import os\nwhile True: os.fork()", timeout=5, backend="process")
    assert "not allowed" in r.observation(500)


# -- where bwrap cannot run: an error that says how to fix it, or the weaker backend by name
def test_without_bwrap_running_code_is_a_one_line_error_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    with pytest.raises(SandboxUnavailable) as info:
        run_python("print(1)")
    message = str(info.value)
    assert "\n" not in message and "apt-get install bubblewrap" in message and "process" in message
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        make_env(MATH_ID)  # at construction, not as a tool failure the model would see
    with pytest.raises(ValueError, match="unknown sandbox"):
        run_python("print(1)", backend="docker")


def test_bwrap_that_cannot_create_namespaces_is_the_same_error(monkeypatch, tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    with pytest.raises(SandboxUnavailable) as info:
        run_python("print(1)")
    message = str(info.value)
    assert "\n" not in message and "No permissions to create new namespace" in message
    assert "apt-get install bubblewrap" in message


def test_the_process_backend_is_chosen_by_name_and_warned_about_once(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # bwrap unavailable: the fallback still works when asked for
    monkeypatch.setattr(esopt.sandbox, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_python("print(6 * 7)", backend="process").stdout.strip() == "42"
        env = make_env(MATH_ID, sandbox="process")
        env.reset(seed=1)
        obs = env.step("<python>print(6 * 7)</python>")[0]
    assert "42" in obs
    weak = [w for w in caught if issubclass(w.category, WeakSandboxWarning)]
    assert len(weak) == 1 and "bwrap" in str(weak[0].message)


# -- the math env through bwrap: the same observations as before
@needs_bwrap
def test_math_env_reads_the_same_through_both_backends():
    calls = ["print(17 * 24 - 5)", "from fractions import Fraction\nprint(Fraction(84, 126))",
             "import math\nprint(math.comb(10, 3), math.sqrt(2))", "1/0",
             "import sympy\nx = sympy.symbols('x')\nprint(sympy.solve(3*x + 7 - 25, x))",
             "import numpy as np\nprint(np.linalg.det(np.array([[2.0, 1.0], [1.0, 3.0]])).round(6))", "x = 1"]
    seen = {}
    for backend in ("bwrap", "process"):
        env = make_env(MATH_ID, sandbox=backend, python_timeout=20)
        assert env.unwrapped.sandbox == backend
        env.reset(seed=3)
        seen[backend] = []
        for code in calls:
            env.reset(seed=3)
            seen[backend].append(env.step(f"<python>{code}</python>")[0])
    assert seen["bwrap"] == seen["process"]
    assert "403" in seen["bwrap"][0] and "2/3" in seen["bwrap"][1] and "[6]" in seen["bwrap"][4]
    with pytest.raises(ValueError, match="unknown sandbox"):
        make_env(MATH_ID, sandbox="chroot")


@needs_bwrap
def test_the_default_is_bwrap():
    assert esopt.sandbox.DEFAULT_BACKEND == "bwrap" and set(esopt.sandbox.BACKENDS) >= {"bwrap", "process"}
    assert make_env(MATH_ID).unwrapped.sandbox == "bwrap"
    assert "bwrap" in run_python("print(1)").layers


@needs_bwrap
def test_the_overhead_bench_prints_a_table(capsys):
    from esopt.experiments.sandbox_overhead import main

    assert main(["--calls", "1", "--backends", "bwrap,process"]) == 0
    out = capsys.readouterr().out
    assert (
        "CPU:" in out and "| code | bare mean / median ms | bwrap mean / median ms | process mean / median ms |" in out
    )
    assert out.count("\n| `") == 2
