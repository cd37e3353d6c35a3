"""Run model-written programs in an OS jail (eval/jail.py) with limits, and read an honest verdict.
Never ``exec`` in-process.

* **Jail**: bubblewrap namespaces (user, PID, mount, network, IPC), uid 65534, a read-only interpreter,
  the run's directory as the only writable place, no host processes in ``/proc``; every process of the
  run dies with it. Without a jail, programs run only if the caller allows it (``unsafe=True``,
  ``codila eval --unsafe-local-exec``), as before: a fresh directory, a minimal environment, ``python
  -I``, limits, and a process group that is killed at the end.
* **Limits**: wall-clock timeout, CPU seconds, address space, file size, open files, processes
  (RLIMIT_NPROC, or a ``pids`` cgroup for root); stderr is kept to its first and last 4 KiB.
* **Verdict**: the program runs inside a harness (``HARNESS``) that reads a random per-run marker from
  stdin before any program code runs, executes the program and then the tests (``check(entry_point)``
  for HumanEval), and writes ``PASS <marker>`` to a dedicated pipe only after the tests returned. A top-
  level ``SystemExit``, ``os._exit``, an ``atexit`` trick, a crash or a kill leave no marker: not passed.
  The functions the program defines may not return objects of classes the program defines (an
  ``__eq__`` that is always true): that is a failure too. A determined attacker in the same process
  can still find the marker in memory; the jail, not the verdict, is the security boundary.

Statuses: ``passed``, ``failed`` (an assertion), ``error`` (another exception, or ``SystemExit``),
``timeout``, ``killed`` (a signal, e.g. the memory limit), ``no-verdict`` (ended without one).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from codila_cli.errors import UsageError

HARNESS = r'''
import os, sys, types
def _harness():
    marker = sys.stdin.readline().strip()
    sys.stdin = open(os.devnull)
    verdict = os.fdopen(int(sys.argv[1]), "w")
    entry = sys.argv[2] if len(sys.argv) > 2 else ""
    body = open("body.py", encoding="utf-8").read()
    test = open("test.py", encoding="utf-8").read()
    ns = {"__name__": "__main__", "__builtins__": __builtins__}
    mine = set()
    def plain(value, depth=0):
        t = type(value)
        if t.__module__ == "__main__" or t in mine:
            raise AssertionError(f"the completion returned a {t.__name__} it defines itself")
        if depth < 4 and t in (list, tuple, set, frozenset):
            for v in value:
                plain(v, depth + 1)
        elif depth < 4 and t is dict:
            for k, v in value.items():
                plain(k, depth + 1); plain(v, depth + 1)
    def guard(fn):
        def guarded(*a, **k):
            out = fn(*a, **k)
            plain(out)
            return out
        guarded.__name__, guarded.__doc__, guarded.__wrapped__ = fn.__name__, fn.__doc__, fn
        return guarded
    try:
        exec(compile(body, "program.py", "exec"), ns)
        mine.update(v for v in ns.values() if isinstance(v, type))
        for name, v in list(ns.items()):
            if isinstance(v, types.FunctionType):
                ns[name] = guard(v)
        exec(compile(test, "test.py", "exec"), ns)
        if entry:
            ns["check"](ns[entry])
    except AssertionError as exc:
        verdict.write(f"FAIL failed {type(exc).__name__}: {str(exc)[:200]}\n"); verdict.flush(); os._exit(1)
    except BaseException as exc:
        verdict.write(f"FAIL error {type(exc).__name__}: {str(exc)[:200]}\n"); verdict.flush(); os._exit(1)
    verdict.write(f"PASS {marker}\n")
    verdict.flush()
    os._exit(0)
_harness()
'''
TAIL = 4096


@dataclass(frozen=True)
class SandboxLimits:
    timeout: float = 10.0
    cpu_seconds: int = 10
    memory_mb: int = 1024
    file_mb: int = 16
    max_procs: int = 32
    max_files: int = 256
    unsafe_local_exec: bool = False  # run without a jail where none exists (codila eval --unsafe-local-exec)

    def __post_init__(self) -> None:
        import math

        if not math.isfinite(self.timeout) or self.timeout <= 0 or self.timeout > 86400:
            raise ValueError(f"the sandbox timeout must be a number of seconds in (0, 86400], got {self.timeout}")
        if self.cpu_seconds < 1 or self.memory_mb < 64 or self.file_mb < 1 or self.max_procs < 1 or self.max_files < 16:
            raise ValueError("sandbox limits must be positive (memory at least 64 MB)")


@dataclass(frozen=True)
class Outcome:
    passed: bool
    status: str  # passed | failed | error | timeout | killed | no-verdict
    returncode: int | None
    seconds: float
    stderr_tail: str
    detail: str = ""


def _own_processes() -> int:
    """Processes of this real uid: RLIMIT_NPROC counts them all, so the run's cap comes on top."""
    uid, n = os.getuid(), 0
    for entry in os.scandir("/proc"):
        try:
            n += entry.name.isdigit() and entry.stat().st_uid == uid
        except OSError:
            continue
    return n


def _limits(limits: SandboxLimits, cgroup: Path | None):
    nproc = None if os.geteuid() == 0 else _own_processes() + limits.max_procs  # root: the cgroup caps it

    def apply() -> None:
        import resource

        mem = limits.memory_mb * 2**20
        for res, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, limits.cpu_seconds),
                           (resource.RLIMIT_FSIZE, limits.file_mb * 2**20), (resource.RLIMIT_CORE, 0),
                           (resource.RLIMIT_NOFILE, limits.max_files), (resource.RLIMIT_NPROC, nproc)):
            if value is not None:
                resource.setrlimit(res, (value, value))
        if cgroup is not None:  # before exec: the run and all it starts are in the cgroup from the start
            with open(cgroup / "cgroup.procs", "w") as fh:
                fh.write(str(os.getpid()))

    return apply


class _Capped:
    """Reads a stream to its end in a thread, keeping the first and the last TAIL bytes."""

    def __init__(self, stream) -> None:
        self.head, self.tail, self.dropped = b"", b"", 0
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        while chunk := stream.read(65536):
            if len(self.head) < TAIL:
                take = TAIL - len(self.head)
                self.head, chunk = self.head + chunk[:take], chunk[take:]
            self.tail = (self.tail + chunk)[-TAIL:]
            self.dropped += max(0, len(chunk) - TAIL)
        stream.close()

    def text(self) -> str:
        gap = f"\n[… {self.dropped} bytes …]\n" if self.dropped else ""
        return (self.head + gap.encode() + self.tail).decode("utf-8", "replace")


def run_sandboxed(program: str, limits: SandboxLimits = SandboxLimits(), *, test: str = "", entry_point: str | None = None,
                  unsafe: bool = False) -> Outcome:
    """Run ``program`` (then ``test``, then ``check(entry_point)``); passed = the harness's verdict."""
    from codila_cli.eval import jail as jails

    jail = jails.detect()
    if jail.kind == "none" and not (unsafe or limits.unsafe_local_exec):
        raise UsageError(f"no jail to run generated code in: {jail.why}",
                         hint="install bubblewrap (apt install bubblewrap), or pass --unsafe-local-exec to run it "
                              "without one (docs/evaluation.md)")
    tmp = Path(tempfile.mkdtemp(prefix="codila-sandbox-"))
    cgroup = None
    try:
        (tmp / "body.py").write_text(program, encoding="utf-8")
        (tmp / "test.py").write_text(test, encoding="utf-8")
        (tmp / "harness.py").write_text(HARNESS, encoding="utf-8")
        read_fd, write_fd = os.pipe()
        args = ["-I", "harness.py", str(write_fd), entry_point or ""]
        if jail.kind == "bwrap":
            cmd = [*jails.command(jail.path, tmp), *args]
            cwd, env = str(tmp), {}
            if os.geteuid() == 0:
                cgroup = jails.pids_cgroup(limits.max_procs)
        else:
            cmd, cwd = [jails.interpreter()[0], *args], str(tmp)
            env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(tmp), "PYTHONDONTWRITEBYTECODE": "1"}
        marker = secrets.token_hex(16)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, pass_fds=(write_fd,), start_new_session=True,
                                preexec_fn=_limits(limits, cgroup))  # noqa: PLW1509 - limits apply pre-exec
        os.close(write_fd)
        err = _Capped(proc.stderr)
        verdict = _Capped(os.fdopen(read_fd, "rb"))
        try:
            proc.stdin.write((marker + "\n").encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            proc.wait(timeout=limits.timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        try:  # the whole run: the jail's init (its PID namespace dies with it), or the process group
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        for reader in (err, verdict):
            reader.thread.join(timeout=5)
        said = verdict.text().strip()
        if timed_out:
            status = "timeout"
        elif said == f"PASS {marker}":
            status = "passed"
        elif said.startswith("FAIL "):
            status = said.split()[1]
        elif proc.returncode is not None and proc.returncode < 0:
            status = "killed"
        else:
            status = "no-verdict"
        return Outcome(status == "passed", status, proc.returncode, time.perf_counter() - t0, err.text()[-2000:],
                       said.removeprefix("FAIL ")[:300] if status not in ("passed",) else "")
    finally:
        jails.remove_cgroup(cgroup)
        remove_tree(tmp)


def remove_tree(path: Path) -> bool:
    """Remove what a program left in its directory, whatever it is: deep nesting (shutil.rmtree recurses,
    and 3,000 nested directories raised RecursionError), directories it made unreadable or unwritable,
    paths past PATH_MAX. Never raises; True when nothing is left. Falls back on ``chmod -R u+rwx`` and
    ``rm -rf --one-file-system`` (coreutils walks a tree of any depth without recursion limits)."""
    import subprocess

    def writable(func, p, _exc):  # onexc/onerror: make the parent usable, then try once more
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    try:
        shutil.rmtree(path, onerror=writable)
    except (OSError, RecursionError):
        pass
    if not os.path.lexists(path):
        return True
    for cmd in (["chmod", "-R", "u+rwx", str(path)], ["rm", "-rf", "--one-file-system", str(path)]):
        try:
            subprocess.run(cmd, capture_output=True, timeout=120, check=False)
        except (OSError, subprocess.SubprocessError):
            pass
    return not os.path.lexists(path)
