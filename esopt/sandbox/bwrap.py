"""The `bwrap` sandbox backend (the default): model-written Python inside bubblewrap namespaces.

bubblewrap is the Debian package `bubblewrap` (binary `bwrap`; `make venv` installs it; not the PyPI package
of that name). Each call is a fresh sandbox, gone when the call returns:

- a mount namespace whose root holds only the Python installation, the venv's site-packages (at /venv,
  without the rest of the venv or the project checkout: `esopt` is not importable inside), /usr and the
  /bin, /lib* links, /etc/ld.so.cache, a new /dev and /proc, all read-only (bwrap's own root and /dev
  included), and a size-limited tmpfs at /tmp (`disk_mb`), the working directory and the only writable place.
  No home, checkout, run dirs or caches: host files are not there to be read or written. Python starts with
  `-I -S`; the bootstrap adds site-packages and the folders their .pth files list, but runs no .pth `import`
  hook (editable installs, distutils shims);
- new pid, network (no interface but a down loopback), ipc, uts and cgroup namespaces: no host process is
  visible or can be signalled, no socket reaches the host (abstract Unix sockets included);
- a uid of its own, never root, no capabilities, `no_new_privs`; `--die-with-parent`, `--new-session` (no
  terminal injection), `--clearenv` and a minimal environment;
- rlimits set before the code is read (CPU seconds, address space, size of any file, open files, processes,
  no core dumps), and the wall-clock kill of bwrap's process group, which takes the pid namespace down with
  it (the kernel kills every process in a pid namespace whose first process dies);
- a seccomp filter (x86_64, aarch64) that refuses new namespaces (unshare, setns, clone with namespace flags;
  clone3 reads as absent so libc falls back to clone), mounts, ptrace, keyrings, bpf, perf events,
  userfaultfd, io_uring and kernel modules.

The uid: a non-root parent runs bwrap as itself with a user namespace (`--unshare-user --uid 65534
--disable-userns`), so the code's processes belong to that user on the host. A root parent is different:
the kernel does not apply RLIMIT_NPROC to host root (user namespace or not), and bwrap resolves bind sources
as its caller, so bwrap run as `nobody` cannot bind a Python that lives under /root (pyenv). So a root parent
runs bwrap as root without a user namespace (every other namespace as above, capabilities dropped but
setuid/setgid) and the bootstrap, before reading the code, becomes a fresh uid from a high unused range
(one per call: process limits and files are per sandbox, so a fork bomb in one episode does not starve a
concurrent one). What the code runs as then owns nothing on the host and holds no capability.

Known limits: tmpfs caps bytes, not inodes (many empty files cost kernel memory until the call ends); the
pid-namespace teardown is asynchronous (stragglers die within milliseconds of the call's end); the seccomp
filter is a deny list, not an allow list; /usr and the Python installation are readable; /dev/shm is
read-only (multiprocessing's semaphores are unavailable); on a root parent the capability bounding set is
left full (no_new_privs and a non-root uid make it moot) and on kernels before 5.14 RLIMIT_NPROC counts a
uid's processes host-wide (a non-root parent's own processes count against `max_processes`).
"""

from __future__ import annotations

import functools
import os
import platform
import secrets
import shutil
import site
import struct
import subprocess
import sys
import tempfile
import threading
import time

from esopt.sandbox.result import SandboxResult, SandboxUnavailable, read_limited, wait_then_kill_group

NOBODY = 65534
UID_BASE, UID_SPAN = 1_800_000_000, 1 << 24  # root parents: each call's uid, unused by real accounts
INSTALL = "install bubblewrap (`apt-get install bubblewrap`, or `make venv`)"
FALLBACK = "or choose the weaker process sandbox by name (sandbox: process / backend='process')"
WORKDIR = "/tmp"
VENV = "/venv"

# Runs in the sandbox before the user's code: uid (root parents), limits, site-packages, the code from stdin.
# Python starts with -S: site-packages are added here, with the folders their .pth files name but none of the
# .pth `import` hooks (editable installs, distutils shims: host machinery, and most of the start-up time).
_BOOTSTRAP = r'''
import os, sys, resource
uid, mem, cpu, fsize, nofile, nproc = map(int, sys.argv[1:7])
if uid:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid) or os.getgroups():
        os._exit(125)
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
for folder in sys.argv[7:]:
    if os.path.isdir(folder) and folder not in sys.path:
        sys.path.append(folder)
        for name in sorted(x for x in os.listdir(folder) if x.endswith(".pth")):
            with open(os.path.join(folder, name), errors="replace") as f:
                for line in f:
                    line = line.rstrip()
                    if line and not line.startswith(("#", "import ", "import\t")):
                        extra = os.path.join(folder, line)
                        if os.path.isdir(extra) and extra not in sys.path:
                            sys.path.append(extra)
import site
site.setquit(), site.setcopyright(), site.sethelper()  # exit(), quit(), help() as usual
del site
source = sys.stdin.buffer.read()
null = os.open("/dev/null", os.O_RDONLY)
os.dup2(null, 0)
os.close(null)
code = compile(source, "<python>", "exec")
del source, null, uid, mem, cpu, fsize, nofile, nproc
sys.argv = ["<python>"]
try:
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit as e:
    if isinstance(e.code, int) and not 0 <= e.code <= 128:
        raise SystemExit(1) from None  # bwrap reports a signal as 128 + its number
    raise
'''


def run_python(code: str, *, timeout: float = 5.0, cpu_seconds: int = 5, memory_mb: int = 512,
               max_output_bytes: int = 64_000, max_processes: int = 64, disk_mb: int = 32) -> SandboxResult:
    """Run `code` in a fresh bubblewrap sandbox (see the module doc) and return its truncated output.
    Raises SandboxUnavailable (one line: how to install bubblewrap) if bwrap cannot run here."""
    if not isinstance(code, str):
        raise TypeError("code must be a string")
    check()
    return _run(code, timeout=timeout, cpu_seconds=cpu_seconds, memory_mb=memory_mb,
                max_output_bytes=max_output_bytes, max_processes=max_processes, disk_mb=disk_mb)


def check() -> None:
    """Raise SandboxUnavailable unless a bwrap sandbox starts here: tried once per bwrap binary and process."""
    path = shutil.which("bwrap")
    if path is None:
        raise SandboxUnavailable(f"the bwrap sandbox needs bubblewrap, which is not installed: {INSTALL}, "
                                 f"{FALLBACK}")
    with _PROBE_LOCK:
        if path not in _PROBED:
            _PROBED[path] = _probe()
        error = _PROBED[path]
    if error is not None:
        raise SandboxUnavailable(f"bwrap cannot create its sandbox here ({error}): {INSTALL} on a kernel that "
                                 f"allows namespaces (a container may need --privileged or a seccomp profile "
                                 f"allowing unshare), {FALLBACK}")


_PROBED: dict[str, str | None] = {}
_PROBE_LOCK = threading.Lock()


def _probe() -> str | None:
    """None if a sandbox runs Python here, else why not (bwrap's own first error line)."""
    try:
        r = _run("print('ok')", timeout=30, cpu_seconds=10, memory_mb=512, max_output_bytes=4000, max_processes=16,
                 disk_mb=1)
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    if r.stdout.strip() == "ok":
        return None
    lines = [x.strip() for x in r.stderr.splitlines() if x.strip()]
    why = next((x for x in lines if x.startswith("bwrap:")), lines[-1] if lines else f"exit status {r.returncode}")
    return why[:200]


def _run(code: str, *, timeout: float, cpu_seconds: int, memory_mb: int, max_output_bytes: int,
         max_processes: int, disk_mb: int) -> SandboxResult:
    root = os.geteuid() == 0
    uid = UID_BASE + secrets.randbelow(UID_SPAN) if root else 0
    args = [shutil.which("bwrap") or "bwrap", *_namespace_args(root), *_mount_args(disk_mb)]
    seccomp = _seccomp_program()
    host = tempfile.mkdtemp(prefix="esopt-bwrap-")  # the parent's side only: code in, output out
    start = time.perf_counter()
    fds: list[int] = []
    try:
        with open(os.path.join(host, "main.py"), "w") as f:
            f.write(code)
        if seccomp is not None:
            fd = os.memfd_create("esopt-seccomp")
            fds.append(fd)
            os.write(fd, seccomp)
            os.lseek(fd, 0, os.SEEK_SET)
            args += ["--seccomp", str(fd)]
        args += ["--", _python(), "-I", "-S", "-B", "-c", _BOOTSTRAP, str(uid), str(memory_mb * 2**20),
                 str(cpu_seconds), str(max_output_bytes), "64", str(max_processes), *_site_packages()]
        with open(os.path.join(host, "main.py"), "rb") as src, \
                open(os.path.join(host, "stdout"), "wb") as out, open(os.path.join(host, "stderr"), "wb") as err:
            proc = subprocess.Popen(args, stdin=src, stdout=out, stderr=err, env={"PATH": "/usr/bin:/bin"}, cwd="/",
                                    start_new_session=True, close_fds=True, pass_fds=tuple(fds))
            for fd in fds:  # bwrap has its copy
                os.close(fd)
            fds.clear()
            timed_out = wait_then_kill_group(proc, timeout)  # bwrap's death takes the pid namespace down
        stdout, stderr = (read_limited(os.path.join(host, name), max_output_bytes) for name in ("stdout", "stderr"))
        full = os.path.getsize(os.path.join(host, "stdout")) >= max_output_bytes
        returncode = proc.returncode
        if returncode is not None and 128 < returncode < 128 + 65:
            returncode = 128 - returncode  # bwrap exits 128 + N when the code died of signal N
        layers = ["bwrap", "mountns", "pidns", "netns", "ipcns", "utsns", "cgroupns", "userns" if not root else "uid",
                  "tmpfs", "env", "rlimits", *(["seccomp"] if seccomp is not None else [])]
        return SandboxResult(stdout, stderr, returncode, timed_out, time.perf_counter() - start, layers, full)
    finally:
        for fd in fds:
            os.close(fd)
        shutil.rmtree(host, ignore_errors=True)


def _namespace_args(root: bool) -> list[str]:
    common = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
              "--hostname", "sandbox", "--die-with-parent", "--new-session", "--clearenv",
              "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", WORKDIR, "--setenv", "TMPDIR", WORKDIR,
              "--setenv", "LANG", "C.UTF-8", "--setenv", "OMP_NUM_THREADS", "1",
              "--setenv", "OPENBLAS_NUM_THREADS", "1", "--setenv", "MKL_NUM_THREADS", "1", "--cap-drop", "ALL"]
    if root:  # no user namespace (see the module doc); the bootstrap needs setuid/setgid to leave root
        return [*common, "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    return ["--unshare-user", "--disable-userns", "--uid", str(NOBODY), "--gid", str(NOBODY), *common]


def _mount_args(disk_mb: int) -> list[str]:
    # bwrap's own root and /dev are unlimited tmpfs, owned by the sandbox's uid under a user namespace:
    # read-only once built, so the size-limited WORKDIR is the only place to write (device nodes still work)
    return [*_readonly_mounts(), "--dev", "/dev", "--proc", "/proc",
            "--perms", "1777", "--size", str(int(disk_mb) * 2**20), "--tmpfs", WORKDIR,
            "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKDIR]


@functools.lru_cache(maxsize=1)
def _readonly_mounts() -> tuple[str, ...]:
    """The read-only part of the sandbox's root: system dirs, the Python installation, the venv's packages."""
    args: list[str] = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--perms", "0755", "--dir", "/etc", "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    made: set[str] = {"/", "/usr", "/etc"}
    for src, dest in _python_mounts():
        parents = []
        parent = os.path.dirname(dest)
        while parent not in made:  # bwrap would make missing parents 0700: readable by no one inside
            parents.append(parent)
            made.add(parent)
            parent = os.path.dirname(parent)
        for p in reversed(parents):
            args += ["--perms", "0755", "--dir", p]
        if src.startswith("symlink:"):
            args += ["--symlink", src[len("symlink:"):], dest]
        else:
            args += ["--ro-bind", src, dest]
        made.add(dest)
    return tuple(args)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


@functools.lru_cache(maxsize=1)
def _python_mounts() -> tuple[tuple[str, str], ...]:
    """(host source, sandbox path): the installation at its own path (compiled-in rpaths need it there) and,
    for a venv, only its pyvenv.cfg and site-packages, at /venv."""
    mounts: list[tuple[str, str]] = []
    base = os.path.realpath(sys.base_prefix)
    if not _under(base, "/usr"):
        mounts.append((base, base))
    stdlib = os.path.realpath(os.path.dirname(os.__file__))
    if not _under(stdlib, "/usr") and not _under(stdlib, base):
        mounts.append((stdlib, stdlib))
    if sys.prefix != sys.base_prefix:
        prefix = os.path.realpath(sys.prefix)
        mounts.append((os.path.join(prefix, "pyvenv.cfg"), f"{VENV}/pyvenv.cfg"))
        seen = set()
        for path in site.getsitepackages([sys.prefix]):
            real = os.path.realpath(path)
            if real in seen or not os.path.isdir(real) or _under(real, base):
                continue
            seen.add(real)
            if _under(os.path.abspath(path), sys.prefix):
                dest = f"{VENV}/{os.path.relpath(os.path.abspath(path), sys.prefix)}"
            elif _under(real, prefix):
                dest = f"{VENV}/{os.path.relpath(real, prefix)}"
            else:
                dest = real
            mounts.append((real, dest))
        mounts.append(("symlink:" + os.path.realpath(sys.executable), f"{VENV}/bin/python"))
    return tuple(mounts)


@functools.lru_cache(maxsize=1)
def _site_packages() -> tuple[str, ...]:
    """This interpreter's site-packages as the sandbox sees them (the venv's under /venv)."""
    inside = []
    for path in site.getsitepackages():
        if not os.path.isdir(path):
            continue
        for src, dest in _python_mounts():
            if not src.startswith("symlink:") and _under(os.path.realpath(path), src):
                inside.append(dest + os.path.realpath(path)[len(src):])
                break
        else:
            if _under(os.path.realpath(path), "/usr"):
                inside.append(os.path.realpath(path))
    return tuple(dict.fromkeys(inside))


def _python() -> str:
    """The interpreter's path inside the sandbox."""
    return f"{VENV}/bin/python" if sys.prefix != sys.base_prefix else os.path.realpath(sys.executable)


# -- seccomp: a small classic-BPF deny list, built by hand (no libseccomp needed)
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# syscalls refused with EPERM, by architecture
_DENY = {
    "x86_64": {"unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161,
               "ptrace": 101, "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "perf_event_open": 298,
               "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
               "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
               "mount_setattr": 442, "kexec_load": 246, "init_module": 175, "finit_module": 313,
               "delete_module": 176},
    "aarch64": {"unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51,
                "ptrace": 117, "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280, "perf_event_open": 241,
                "userfaultfd": 282, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
                "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
                "mount_setattr": 442, "kexec_load": 104, "init_module": 105, "finit_module": 273,
                "delete_module": 106},
}
_CLONE = {"x86_64": 56, "aarch64": 220}
_CLONE3 = 435
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET (a time namespace needs unshare or clone3)
_CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
_EPERM, _ENOSYS = 1, 38


@functools.lru_cache(maxsize=1)
def _seccomp_program() -> bytes | None:
    """The filter as bwrap's --seccomp wants it (struct sock_filter[]), or None on other architectures."""
    machine = platform.machine()
    if machine not in _AUDIT_ARCH:
        return None
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ/JGE/JSET|K, BPF_RET|K
    allow, kill, errno = 0x7FFF0000, 0x80000000, 0x00050000

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("=HBBI", code, jt, jf, k)

    prog = [op(ld, 4), op(jeq, _AUDIT_ARCH[machine], 1, 0), op(ret, kill), op(ld, 0)]  # arch, then nr
    if machine == "x86_64":  # the x32 ABI's numbers would bypass the table
        prog += [op(jge, 0x40000000, 0, 1), op(ret, errno | _EPERM)]
    for nr in _DENY[machine].values():
        prog += [op(jeq, nr, 0, 1), op(ret, errno | _EPERM)]
    prog += [op(jeq, _CLONE3, 0, 1), op(ret, errno | _ENOSYS)]  # its flags live in memory: make libc use clone
    prog += [op(jeq, _CLONE[machine], 0, 3), op(ld, 16), op(jset, _CLONE_NS_FLAGS, 0, 1), op(ret, errno | _EPERM)]
    prog += [op(ret, allow)]
    return b"".join(prog)
