"""Run model-written programs in OS jails (eval/jail.py) with limits, and read a verdict the program
cannot forge. Never ``exec`` in-process.

* **Isolated verdict** (every task with tests, unless it is marked ``"verdict": "in-process"``): two
  jails. The program's holds only the program (``jailed/program.py`` runs it and answers calls); the
  tests' holds the tests and the task's trusted reference code (``jailed/judge.py``). The tests call
  the program through stand-ins that pass plain data (``jailed/wire.py``: no object of the program's
  making, no ``__eq__`` of its own, no ``int`` subclass) over two pipes; the verdict is written by the
  tests' process to a pipe only codila holds, after the tests returned. The program cannot see the
  tests, their expected values, the tests' process or its descriptors (another PID, mount and user
  namespace), so it passes only by computing the answers. Names: eval/verdict.py.
* **In-process verdict** (``jailed/inproc.py``): the program and its tests in one process, for tasks
  whose tests need the program's own objects (a class under test), and for programs that carry their
  own asserts. A program can forge it; rows say ``verdict: in-process`` and the summary counts them.
* **Jail**: bubblewrap namespaces (user, PID, mount, network, IPC), uid 65534, a read-only interpreter,
  size-capped tmpfs ``/sandbox``, ``/tmp`` and ``/dev/shm`` as the only writable places (nothing is
  written to the host's disk), no host processes in ``/proc``; every process of the run dies with it.
  Without a jail, programs run only if the caller allows it (``unsafe=True``, ``codila eval
  --unsafe-local-exec``): a fresh directory, a minimal environment, ``python -I``, limits, and a process
  group that is killed at the end; there the verdict is not protected (same user, same machine).
* **Limits**: wall-clock timeout, CPU seconds, memory (for the whole run in a memory cgroup where one is
  writable, and per process), file size, open files, processes (RLIMIT_NPROC, or a ``pids`` cgroup),
  scratch space; stderr is kept to its first and last 4 KiB.

Statuses: ``passed``, ``failed`` (an assertion, or a result that is not plain data), ``error`` (another
exception, ``SystemExit``, or the program ended before it answered), ``timeout``, ``killed`` (a signal,
e.g. the memory limit), ``no-verdict`` (the deciding process ended without a verdict).
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
from importlib import resources
from pathlib import Path

from codila_cli.errors import UsageError

TAIL = 4096


@dataclass(frozen=True)
class SandboxLimits:
    timeout: float = 10.0
    cpu_seconds: int = 10
    memory_mb: int = 1024  # the whole run where a memory cgroup is writable, else each process
    file_mb: int = 16
    max_procs: int = 32
    max_files: int = 256
    scratch_mb: int = 64  # each of /sandbox, /tmp, /dev/shm in the jail
    unsafe_local_exec: bool = False  # run without a jail where none exists (codila eval --unsafe-local-exec)

    def __post_init__(self) -> None:
        import math

        if not math.isfinite(self.timeout) or self.timeout <= 0 or self.timeout > 86400:
            raise ValueError(f"the sandbox timeout must be a number of seconds in (0, 86400], got {self.timeout}")
        if (self.cpu_seconds < 1 or self.memory_mb < 64 or self.file_mb < 1 or self.max_procs < 1
                or self.max_files < 16 or self.scratch_mb < 1):
            raise ValueError("sandbox limits must be positive (memory at least 64 MB)")


@dataclass(frozen=True)
class Outcome:
    passed: bool
    status: str  # passed | failed | error | timeout | killed | no-verdict
    returncode: int | None
    seconds: float
    stderr_tail: str
    detail: str = ""
    verdict: str = "isolated"  # "isolated" (tests in their own jail) or "in-process"


def _own_processes(uid: int) -> int:
    """Processes of the real uid ``uid``: RLIMIT_NPROC counts them all, so the run's cap comes on top."""
    n = 0
    for entry in os.scandir("/proc"):
        try:
            n += entry.name.isdigit() and entry.stat().st_uid == uid
        except OSError:
            continue
    return n


def _limits(limits: SandboxLimits, groups, *, jailed: bool = True):
    from codila_cli.eval import jail as jails

    # root: a pids cgroup caps the run, else the jail starts as uid 65534, whose processes RLIMIT_NPROC counts
    drop = jailed and jails.drops_to_nobody(groups)
    nproc = _own_processes(jails.NOBODY if drop else os.getuid()) + limits.max_procs \
        if os.geteuid() != 0 or drop else None

    def apply() -> None:
        import resource

        mem = limits.memory_mb * 2**20
        # with a cgroup counting the whole run's CPU (_wait stops it there), the per-process limit is a backstop
        cpu = limits.cpu_seconds + (2 if groups.cpu is not None else 0)
        for res, value in ((resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu),
                           (resource.RLIMIT_FSIZE, limits.file_mb * 2**20), (resource.RLIMIT_CORE, 0),
                           (resource.RLIMIT_NOFILE, limits.max_files), (resource.RLIMIT_NPROC, nproc)):
            if value is not None:
                resource.setrlimit(res, (value, value))
        for group in groups.dirs:  # before exec: the run and all it starts are in its cgroups from the start
            with open(group / "cgroup.procs", "w") as fh:
                fh.write(str(os.getpid()))
        if drop:
            jails.become_nobody()

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


def _script(name: str) -> str:
    return (resources.files("codila_cli.eval.jailed") / name).read_text(encoding="utf-8")


class _Jailed:
    """One process in a jail of its own: its files copied in (bwrap ``--file`` into a tmpfs, or a fresh
    host directory without a jail), the given descriptors passed, the limits applied before exec, its
    stderr read in a thread. :meth:`close` kills everything it started and removes what it left."""

    def __init__(self, jail, files: dict[str, str], args: list[str], limits: SandboxLimits, *,
                 pass_fds: tuple[int, ...] = (), stdin: str = "", capped: bool = True) -> None:
        from codila_cli.eval import jail as jails

        self.tmp: Path | None = None
        self.groups = jails.RunGroups()
        memfds: list[int] = []
        try:
            if jail.kind == "bwrap":
                for name, text in files.items():
                    fd = os.memfd_create(name)
                    memfds.append(fd)
                    os.write(fd, text.encode("utf-8"))
                    os.lseek(fd, 0, os.SEEK_SET)
                if capped:
                    self.groups = jails.run_cgroups(max_procs=limits.max_procs, memory_bytes=limits.memory_mb * 2**20)
                cmd = [*jails.command(jail.path, files=tuple(zip(memfds, files)), scratch_bytes=limits.scratch_mb * 2**20,
                                      nobody=jails.drops_to_nobody(self.groups)), "-I", *args]
                cwd, env = None, {}
            else:
                self.tmp = Path(tempfile.mkdtemp(prefix="codila-sandbox-"))
                for name, text in files.items():
                    (self.tmp / name).write_text(text, encoding="utf-8")
                cmd, cwd = [jails.interpreter()[0], "-I", *args], str(self.tmp)
                env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(self.tmp), "PYTHONDONTWRITEBYTECODE": "1"}
            self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, pass_fds=(*pass_fds, *memfds), start_new_session=True,
                                         preexec_fn=_limits(limits, self.groups, jailed=jail.kind == "bwrap"))  # noqa: PLW1509 - limits pre-exec
        except BaseException:
            self._clean()
            raise
        finally:
            for fd in memfds:
                os.close(fd)
        self.err = _Capped(self.proc.stderr)
        try:
            self.proc.stdin.write(stdin.encode())
            self.proc.stdin.close()
        except BrokenPipeError:
            pass

    def close(self) -> None:
        try:  # the whole run: the jail's init (its PID namespace dies with it), or the process group
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self.err.thread.join(timeout=5)
        self._clean()

    def _clean(self) -> None:
        from codila_cli.eval import jail as jails

        jails.remove_cgroups(self.groups)
        if self.tmp is not None:
            remove_tree(self.tmp)


def _wait(proc: subprocess.Popen, timeout: float, run: _Jailed | None = None, cpu_seconds: float | None = None) -> bool:
    """True if ``proc`` ran past ``timeout``, or the jailed ``run`` (all its processes together, as its
    cgroup counts them) past ``cpu_seconds`` of CPU: RLIMIT_CPU alone is per process, and children each
    got their own (issue 53)."""
    from codila_cli.eval.jail import cpu_seconds_used

    end = time.monotonic() + timeout
    while True:
        try:
            proc.wait(timeout=max(0.0, min(0.05, end - time.monotonic())))
            return False
        except subprocess.TimeoutExpired:
            if time.monotonic() >= end:
                return True
            if run is not None and cpu_seconds is not None and (cpu_seconds_used(run.groups) or 0.0) > cpu_seconds:
                return True


def _status(said: str, marker: str, *, timed_out: bool, returncode: int | None) -> str:
    if timed_out:
        return "timeout"
    if said == f"PASS {marker}":
        return "passed"
    kind = said.split()[1] if said.startswith("FAIL ") and len(said.split()) > 1 else ""
    if kind in ("failed", "error"):
        return kind
    if kind == "ended":
        return "killed" if _signalled(returncode) else "error"
    return "killed" if _signalled(returncode) else "no-verdict"


def _signalled(returncode: int | None) -> bool:
    """Ended by a signal: a negative code, or bwrap's 128 + signal for its child."""
    return returncode is not None and (returncode < 0 or 128 < returncode < 160)


def run_sandboxed(program: str, limits: SandboxLimits = SandboxLimits(), *, test: str = "", entry_point: str | None = None,
                  reference: str = "", isolated: bool = True, unsafe: bool = False) -> Outcome:
    """Run ``program`` against ``test`` (then ``check(entry_point)``) and return the verdict: isolated
    (the tests in a jail of their own, ``reference`` the trusted code they run first) when there are
    tests and ``isolated``, else in-process. Without tests the program passes when it runs to its end."""
    from codila_cli.eval import jail as jails

    jail = jails.detect()
    if jail.kind == "none" and not (unsafe or limits.unsafe_local_exec):
        raise UsageError(f"no jail to run generated code in: {jail.why}",
                         hint="install bubblewrap (apt install bubblewrap), or pass --unsafe-local-exec to run it "
                              "without one (docs/evaluation.md)")
    if test and isolated:
        return _run_isolated(jail, program, test, entry_point, reference, limits)
    return _run_in_process(jail, program, test, entry_point, limits)


def _run_in_process(jail, program: str, test: str, entry_point: str | None, limits: SandboxLimits) -> Outcome:
    marker = secrets.token_hex(16)
    read_fd, write_fd = os.pipe()
    t0 = time.perf_counter()
    try:
        run = _Jailed(jail, {"body.py": program, "test.py": test, "harness.py": _script("inproc.py"),
                             "decide.py": _script("decide.py")},
                      ["harness.py", str(write_fd), entry_point or ""], limits, pass_fds=(write_fd,), stdin=marker + "\n")
    finally:
        os.close(write_fd)
    verdict = _Capped(os.fdopen(read_fd, "rb"))
    try:
        timed_out = _wait(run.proc, limits.timeout, run, limits.cpu_seconds)
    finally:
        run.close()
    verdict.thread.join(timeout=5)
    said = verdict.text().strip()
    status = _status(said, marker, timed_out=timed_out, returncode=run.proc.returncode)
    return Outcome(status == "passed", status, run.proc.returncode, time.perf_counter() - t0, run.err.text()[-2000:],
                   said.removeprefix("FAIL ")[:300] if status != "passed" else "", verdict="in-process")


def _run_isolated(jail, program: str, test: str, entry_point: str | None, reference: str,
                  limits: SandboxLimits) -> Outcome:
    from codila_cli.eval.verdict import program_names, test_modules

    names = program_names(test, entry_point=entry_point, reference=reference)
    modules = test_modules(test, reference)
    marker = secrets.token_hex(16)
    req_r, req_w = os.pipe()  # the tests' requests, read by the program's jail
    rep_r, rep_w = os.pipe()  # the program's replies, read by the tests' jail
    ver_r, ver_w = os.pipe()  # the verdict: only the tests' jail holds its write end
    wire = _script("wire.py")
    runs: list[_Jailed] = []
    t0 = time.perf_counter()
    try:
        runs.append(_Jailed(jail, {"body.py": program, "program.py": _script("program.py"), "wire.py": wire},
                            ["program.py", str(req_r), str(rep_w)], limits, pass_fds=(req_r, rep_w)))
        files = {"test.py": test, "judge.py": _script("judge.py"), "wire.py": wire, "decide.py": _script("decide.py")}
        if reference:
            files["reference.py"] = reference
        runs.append(_Jailed(jail, files, ["judge.py", str(ver_w), str(req_w), str(rep_r), entry_point or "",
                                          ",".join(names), ",".join(modules)], limits, pass_fds=(ver_w, req_w, rep_r),
                            stdin=marker + "\n", capped=False))
    except BaseException:
        for run in runs:
            run.close()
        raise
    finally:
        for fd in (req_r, req_w, rep_r, rep_w, ver_w):
            os.close(fd)
    program_run, judge = runs
    verdict = _Capped(os.fdopen(ver_r, "rb"))
    try:
        timed_out = _wait(judge.proc, limits.timeout, program_run, limits.cpu_seconds)
        verdict.thread.join(timeout=0 if timed_out else 5)
        said = verdict.text().strip()
        if said.startswith("FAIL ended"):  # how the program's process ended (a signal: killed)
            _wait(program_run.proc, 1.0)
        returncode = program_run.proc.poll()
    finally:
        for run in (program_run, judge):
            run.close()
    status = _status(said, marker, timed_out=timed_out, returncode=returncode)
    if status == "no-verdict" and judge.proc.returncode not in (0, 1):
        status = "error"  # the tests' own process failed (their jail's limits): not the program's pass
    return Outcome(status == "passed", status, returncode, time.perf_counter() - t0,
                   program_run.err.text()[-2000:], said.removeprefix("FAIL ")[:300] if status != "passed" else "")


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
