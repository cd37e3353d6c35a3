"""Run model-written programs in a separate, limited process. Never ``exec`` in-process.

Containment, in layers (docs/reliability.md):
* a fresh temporary directory as cwd and HOME, removed afterwards; a minimal environment (no
  inherited secrets: only PATH, LANG and HOME);
* ``python -I`` (isolated mode: no user site, no PYTHON* variables);
* resource limits: wall-clock timeout (the whole process group is killed, also after a normal exit),
  CPU seconds, address space, file size; when codila runs as root and ``nobody`` can run the
  interpreter, the program runs as ``nobody`` with a process cap (RLIMIT_NPROC does not bind root);
* network: a new, empty network namespace (``unshare(CLONE_NEWNET)``) where the OS allows it; otherwise, and in any case,
  a Python-level guard makes sockets, subprocesses, ``fork`` and writes/deletes outside the temporary
  directory raise, so such a program fails.
The guard is a seat belt, not a jail: it stops accidents and careless code, not a determined attacker.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

GUARD = r'''
import builtins as _b, os as _os, sys as _sys
_root = _os.path.realpath(_os.getcwd())
def _inside(p):
    try:
        return _os.path.realpath(_os.fspath(p)).startswith(_root + _os.sep)
    except Exception:
        return False
def _deny(*a, **k):
    raise PermissionError("blocked by the codila sandbox")
_open = _b.open
def _guarded_open(file, mode="r", *a, **k):
    if isinstance(file, int):
        return _open(file, mode, *a, **k)
    if any(c in mode for c in "wax+") and not _inside(file):
        raise PermissionError(f"write outside the sandbox directory: {file}")
    return _open(file, mode, *a, **k)
_b.open = _guarded_open
import io as _io
_io.open = _guarded_open
for _name in ("remove", "unlink", "rmdir", "removedirs", "rename", "renames", "replace", "truncate", "chmod", "chown", "link", "symlink"):
    if hasattr(_os, _name):
        _orig = getattr(_os, _name)
        def _wrap(*a, _orig=_orig, **k):
            if all(_inside(x) for x in a if isinstance(x, (str, bytes, _os.PathLike))):
                return _orig(*a, **k)
            _deny()
        setattr(_os, _name, _wrap)
for _name in ("fork", "forkpty", "system", "popen", "execv", "execve", "execl", "execle", "execlp", "execvp", "execvpe",
              "spawnl", "spawnv", "spawnve", "spawnvp", "posix_spawn", "posix_spawnp", "kill", "killpg", "setuid", "setsid", "setpgid", "putenv"):
    if hasattr(_os, _name):
        setattr(_os, _name, _deny)
import subprocess as _sp
_sp.Popen = _deny; _sp.run = _deny; _sp.call = _deny; _sp.check_output = _deny; _sp.check_call = _deny
import socket as _socket
_socket.socket = _deny; _socket.create_connection = _deny
import shutil as _shutil
_shutil.rmtree = _deny; _shutil.move = _deny
del _b, _io, _sp, _socket, _shutil
'''


@dataclass(frozen=True)
class SandboxLimits:
    timeout: float = 10.0
    cpu_seconds: int = 10
    memory_mb: int = 1024
    file_mb: int = 16
    max_procs: int = 32

    def __post_init__(self) -> None:
        if self.timeout <= 0 or self.cpu_seconds < 1 or self.memory_mb < 64 or self.file_mb < 1 or self.max_procs < 1:
            raise ValueError("sandbox limits must be positive (memory at least 64 MB)")


@dataclass(frozen=True)
class Outcome:
    passed: bool
    status: str  # passed | failed | timeout
    returncode: int | None
    seconds: float
    stderr_tail: str


CLONE_NEWNET = 0x40000000
_CAN_DROP = True  # becomes False once `nobody` turns out unable to run our interpreter


def _new_netns() -> bool:
    """Enter a new, empty network namespace (Linux, needs root or user namespaces); False if refused."""
    if sys.platform != "linux":
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.unshare(CLONE_NEWNET) == 0
    except (OSError, AttributeError):
        return False


def _limits(limits: SandboxLimits, drop_to: int | None):
    def apply() -> None:
        import resource

        mem = limits.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))
        fsize = limits.file_mb * 2**20
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        _new_netns()  # before dropping privileges; the Python guard blocks sockets either way
        if drop_to is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_procs, limits.max_procs))
            os.setgroups([])
            os.setgid(drop_to)
            os.setuid(drop_to)

    return apply


def run_sandboxed(program: str, limits: SandboxLimits = SandboxLimits()) -> Outcome:
    """Run ``program`` (Python source) in a fresh directory; passed = exit status 0 within the limits."""
    global _CAN_DROP
    drop_to = 65534 if _CAN_DROP and hasattr(os, "geteuid") and os.geteuid() == 0 else None
    tmp = tempfile.mkdtemp(prefix="codila-sandbox-")
    try:
        if drop_to is not None:
            os.chown(tmp, drop_to, drop_to)
        path = os.path.join(tmp, "program.py")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(GUARD + "\n" + program)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": tmp, "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = [sys.executable, "-I", path]
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    preexec_fn=_limits(limits, drop_to))  # noqa: PLW1509 - limits apply pre-exec
        except PermissionError:
            if drop_to is None:
                raise
            # the interpreter is not readable by `nobody` (e.g. it lives under /root): run as ourselves
            _CAN_DROP = False
            drop_to = None
            proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    preexec_fn=_limits(limits, None))  # noqa: PLW1509
        try:
            _, err = proc.communicate(timeout=limits.timeout)
            status = "passed" if proc.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _, err = proc.communicate()
            status = "timeout"
        try:  # stray children (forked before the guard, or by native code) die with the group
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        tail = (err or b"").decode("utf-8", "replace")[-2000:]
        return Outcome(status == "passed", status, proc.returncode, time.perf_counter() - t0, tail)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
