"""The OS jail generated programs run in: bubblewrap (``bwrap``, packaged by Debian, Ubuntu, Fedora…).

Each run gets new user, PID, mount, network, IPC, UTS and cgroup namespaces (``--unshare-all``), all
capabilities dropped, uid/gid 65534 inside, and a file system of its own: the interpreter's prefix and
``/usr`` (and the ``/lib*``/``/bin`` trees where they are real directories) read-only, a fresh ``/proc``
that shows only the run's own processes, a minimal ``/dev``, private size-capped ``/tmp`` and ``/dev/shm``,
and the run's directory (``/sandbox``, a tmpfs the run's files are copied into) as the only writable
places. The environment is cleared. When the run's first process (the namespace's init) ends, the kernel kills every process left in the PID namespace, so nothing a
program starts outlives it. A cap on processes: a ``pids`` cgroup when one is writable, else
RLIMIT_NPROC, which the kernel does not apply to root's processes: codila run as root without a pids
cgroup starts the jail as uid/gid 65534 (:func:`drops_to_nobody`, where bwrap works so), and only where
that cannot work either is there no cap (``codila doctor`` and ``codila eval`` say so); memory for the whole run
in a ``memory`` cgroup where one is writable (:func:`run_cgroups`), else per process (RLIMIT_AS).

Where bwrap is missing or cannot create namespaces (macOS, containers without user namespaces),
:func:`detect` says so and ``codila eval`` refuses to run generated code unless the user passes
``--unsafe-local-exec`` (docs/evaluation.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class Jail:
    kind: str  # "bwrap" or "none"
    path: str | None = None
    why: str = ""  # for "none": what is missing

    def describe(self) -> str:
        return f"bubblewrap ({self.path})" if self.kind == "bwrap" else f"none: {self.why}"


def interpreter(*, nobody: bool = False) -> tuple[str, str]:
    """(the real Python binary, its installation prefix): the stdlib-only interpreter a program runs on
    (a virtual environment's site-packages are not part of the jail). ``nobody``: for a jail started as
    uid 65534 (:func:`drops_to_nobody`), which cannot reach an interpreter under a private directory such
    as a 0700 ``/root``: then the system's ``python3`` of the same version, where there is one."""
    own = os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)
    if not nobody or _nobody_reaches(own[0]):
        return own
    return _system_python() or own


@lru_cache(maxsize=1)
def _system_python() -> tuple[str, str] | None:
    """The system's ``python3`` of this interpreter's version, reachable by uid 65534; None if none (asked
    once per process: every run of a root codila without a pids cgroup needs it)."""
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system is None or not _nobody_reaches(os.path.realpath(system)):
        return None
    try:
        r = subprocess.run([system, "-I", "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                           text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (os.path.realpath(system), "/usr") if r.stdout.strip() == str(tuple(sys.version_info[:2])) else None


def _nobody_reaches(path: str) -> bool:
    """Whether uid 65534 may enter every directory above ``path`` and run it (world-executable bits)."""
    import stat

    p = Path(path)
    try:
        return all(os.stat(d).st_mode & stat.S_IXOTH for d in p.parents) and bool(os.stat(p).st_mode & stat.S_IXOTH)
    except OSError:
        return False


@lru_cache(maxsize=1)
def detect() -> Jail:
    """bubblewrap if it is installed and can run the interpreter in a full set of namespaces here."""
    path = shutil.which("bwrap")
    if path is None:
        return Jail("none", why="bwrap (bubblewrap) is not installed")
    try:
        r = subprocess.run([*command(path, probe=True), "-I", "-c", "print('ok')"], capture_output=True,
                           text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Jail("none", why=f"bwrap does not start ({exc})")
    if r.returncode != 0 or r.stdout.strip() != "ok":
        return Jail("none", why=f"bwrap cannot create namespaces here ({(r.stderr or r.stdout).strip()[:160]})")
    return Jail("bwrap", path)


def command(bwrap: str, *, files: tuple[tuple[int, str], ...] = (), scratch_bytes: int | None = None,
            probe: bool = False, nobody: bool = False) -> list[str]:
    """The bwrap command line up to the interpreter (the caller appends its arguments).

    The run's directory ``/sandbox`` is a tmpfs of its own, never a host directory: ``files`` are
    (descriptor, name) pairs that bwrap copies into it (``--file``) before the program starts, so a run
    leaves nothing on the host's disk. ``/sandbox``, ``/tmp`` and ``/dev/shm`` are each capped at
    ``scratch_bytes`` (tmpfs ``size=``; their pages are also charged to the run's memory cgroup)."""
    python, prefix = interpreter(nobody=nobody)
    args = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", "65534", "--gid", "65534", "--hostname", "codila-sandbox", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8", "--setenv", "HOME", "/sandbox",
            "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    if not prefix.startswith("/usr/"):
        args += ["--ro-bind", prefix, prefix]
    size = ["--size", str(scratch_bytes)] if scratch_bytes else []
    # bwrap's /dev is a tmpfs with no size of its own: read-only once /dev/shm is mounted on it (issue 60:
    # 300 MiB went into /dev); its device nodes (/dev/null, /dev/urandom) are written to as before
    args += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/tmp", *size, "--tmpfs", "/dev/shm",
             "--remount-ro", "/dev"]
    if not probe:
        args += [*size, "--tmpfs", "/sandbox"]
        for fd, name in files:
            args += ["--perms", "0644", "--file", str(fd), f"/sandbox/{name}"]
        args += ["--chdir", "/sandbox"]
    # bwrap's own root is a tmpfs with no size: read-only once everything is mounted (issue 53: 300 MiB
    # went into /), so the capped tmpfs mounts above are the only writable places
    return [*args, "--remount-ro", "/", "--", python]


@dataclass(frozen=True)
class RunGroups:
    """The cgroups one run is placed in (before exec, so all it starts is counted): a ``pids`` cap and a
    ``memory`` cap for the whole run (every process and its tmpfs pages together), where writable."""
    dirs: tuple[Path, ...] = ()
    pids: bool = False
    memory: bool = False
    cpu: Path | None = None  # the file that counts the run's CPU time (v2 cpu.stat, v1 cpuacct.usage)


def cpu_seconds_used(groups: RunGroups) -> float | None:
    """CPU seconds every process of the run used together so far; None where no cgroup counts them."""
    if groups.cpu is None:
        return None
    try:
        text = groups.cpu.read_text()
    except OSError:
        return None
    if groups.cpu.name == "cpu.stat":
        usec = next((int(line.split()[1]) for line in text.splitlines() if line.startswith("usage_usec ")), None)
        return None if usec is None else usec / 1e6
    return int(text.strip() or 0) / 1e9


def _v2_root() -> Path | None:
    for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (root / "cgroup.controllers").is_file():
            return root
    return None


def _own(hierarchy: str) -> str | None:
    """This process's cgroup path in ``hierarchy`` ("" for v2's unified one, else a v1 controller), from
    /proc/self/cgroup; None where unknown."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            if (hierarchy == "" and names == "") or hierarchy in names.split(","):
                return path
    except (OSError, ValueError):
        pass
    return None


def _new_group(root: Path, settings: dict[str, str]) -> Path | None:
    _sweep(root)
    group = root / f"codila-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        group.mkdir()
    except OSError:
        return None
    try:
        for name, value in settings.items():
            (group / name).write_text(value)
        return group
    except OSError:
        remove_cgroups(RunGroups((group,)))
        return None


def run_cgroups(*, max_procs: int, memory_bytes: int) -> RunGroups:
    """New cgroups capping one run's processes and its memory, where this process may create them, always
    below this process's own cgroup, never at the hierarchy's root (a run must stay inside the limits
    its invoker runs under: issue 53): v2 (one group with ``pids.max`` and ``memory.max``, no swap)
    where the own cgroup delegates those controllers, else v1's ``pids`` and ``memory`` hierarchies
    (``memory.limit_in_bytes``, and ``memory.memsw.limit_in_bytes`` where swap accounting is on). What cannot be created is left out:
    the fallback is the per-process limits (RLIMIT_NPROC, RLIMIT_AS) that :mod:`sandbox` always sets."""
    root = _v2_root()
    own = _own("")
    if root is not None and own is not None:
        base = root / own.lstrip("/")  # nested under codila's own cgroup: its limits hold for the run too
        try:
            wanted = set((base / "cgroup.subtree_control").read_text(errors="ignore").split()) & {"pids", "memory"}
        except OSError:
            wanted = set()
        settings = {"pids.max": str(max_procs)} if "pids" in wanted else {}
        if "memory" in wanted:
            settings.update({"memory.max": str(memory_bytes), "memory.swap.max": "0"})
        group = _new_group(base, settings) if settings else None
        if group is not None:
            stat = group / "cpu.stat"  # counted in every v2 group, controller or not
            return RunGroups((group,), "pids" in wanted, "memory" in wanted, stat if stat.is_file() else None)
    dirs, pids, memory = [], False, False
    v1 = Path("/sys/fs/cgroup")
    own_pids, own_memory = _own("pids"), _own("memory")
    if own_pids is not None and ((v1 / "pids" / "pids.max").exists() or (v1 / "pids" / "cgroup.procs").is_file()):
        group = _new_group(v1 / "pids" / own_pids.lstrip("/"), {"pids.max": str(max_procs)})
        if group is not None:
            dirs.append(group)
            pids = True
    if own_memory is not None and (v1 / "memory" / "memory.limit_in_bytes").is_file():
        group = _new_group(v1 / "memory" / own_memory.lstrip("/"), {"memory.limit_in_bytes": str(memory_bytes)})
        if group is not None:
            try:
                if (group / "memory.memsw.limit_in_bytes").is_file():
                    (group / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            except OSError:
                pass
            dirs.append(group)
            memory = True
    cpu = None
    own_cpu = _own("cpuacct")
    if own_cpu is not None and (v1 / "cpuacct" / "cpuacct.usage").is_file():
        group = _new_group(v1 / "cpuacct" / own_cpu.lstrip("/"), {})
        if group is not None:
            dirs.append(group)
            cpu = group / "cpuacct.usage"
    return RunGroups(tuple(dirs), pids, memory, cpu)


def remove_cgroups(groups: RunGroups, *, patience_s: float = 10.0) -> None:
    """Remove a run's cgroups once the kernel has reaped its processes: every process still listed in
    one is killed, and removal is retried for up to ``patience_s`` seconds (a jail's tmpfs can take over
    a second to tear down, and its group stayed behind: issue 60). What is left even then is removed by
    the next run's :func:`_sweep` once this process has ended."""
    import signal
    import time

    for group in groups.dirs:
        end = time.monotonic() + patience_s
        while True:
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > end:
                    break
                for pid in _members(group):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                time.sleep(0.02)


def _members(group: Path) -> list[int]:
    try:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _sweep(root: Path) -> None:
    """Remove the empty run cgroups under ``root`` that an ended codila process left (``codila-PID-…``
    where PID no longer runs)."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for entry in entries:
        parts = entry.name.split("-")
        if len(parts) != 3 or parts[0] != "codila" or not parts[1].isdigit() or int(parts[1]) == os.getpid():
            continue
        try:
            os.kill(int(parts[1]), 0)
            continue  # its codila still runs: its own to remove
        except ProcessLookupError:
            pass
        except OSError:
            continue
        try:
            entry.rmdir()
        except OSError:
            pass


NOBODY = 65534  # the uid and gid a root codila's jails start as when no pids cgroup caps them


def become_nobody() -> None:
    """Drop every privilege to uid/gid 65534 (in a child, before it runs bwrap)."""
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)


def drops_to_nobody(groups: RunGroups) -> bool:
    """Whether a run with ``groups`` starts as uid 65534, so that RLIMIT_NPROC caps its processes: codila
    runs as root (whose processes the kernel does not count), no pids cgroup caps the run, and bwrap works
    started as that user here (with an interpreter it can reach: :func:`interpreter`)."""
    return os.geteuid() == 0 and not groups.pids and nobody_runs_jail()


@lru_cache(maxsize=1)
def nobody_runs_jail() -> bool:
    path = shutil.which("bwrap")
    if path is None or os.geteuid() != 0:
        return False
    try:
        r = subprocess.run([*command(path, probe=True, nobody=True), "-I", "-c", "print('ok')"], capture_output=True,
                           text=True, timeout=20, check=False, preexec_fn=become_nobody)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0 and r.stdout.strip() == "ok"


def limits_in_force(limits) -> list[str]:
    """What caps a run here (``limits``: an eval.sandbox.SandboxLimits), in words for ``codila doctor``:
    the cgroups are tried, not assumed."""
    max_procs, memory_mb = limits.max_procs, limits.memory_mb
    groups = run_cgroups(max_procs=max_procs, memory_bytes=memory_mb * 2**20)
    remove_cgroups(groups)
    memory = (f"{memory_mb} MiB for the whole run (memory cgroup)" if groups.memory else
              f"{memory_mb} MiB per process only (RLIMIT_AS; no writable memory cgroup)")
    if groups.pids:
        procs = f"{max_procs} (pids cgroup)"
    elif drops_to_nobody(groups):
        procs = f"{max_procs} (RLIMIT_NPROC: as root without a writable pids cgroup, runs start as uid {NOBODY})"
    elif os.geteuid() == 0:
        procs = "none (root, no writable pids cgroup, and bwrap does not run as an unprivileged user here)"
    else:
        procs = f"{max_procs} (RLIMIT_NPROC)"
    return [f"memory {memory}", f"processes {procs}",
            f"scratch {limits.scratch_mb} MiB each for /sandbox, /tmp, /dev/shm (tmpfs)",
            f"files {limits.file_mb} MiB each, {limits.max_files} open at once",
            f"time {limits.timeout:g} s, CPU {limits.cpu_seconds} s "
            + ("for the whole run (cgroup)" if groups.cpu is not None else "per process (RLIMIT_CPU; no cgroup counts a run)")]


def limit_gaps(limits) -> list[str]:
    """The limits a run cannot have here, one sentence each (``codila eval`` warns with them): no process
    cap as root without a writable pids cgroup, memory capped per process only without a memory cgroup."""
    groups = run_cgroups(max_procs=limits.max_procs, memory_bytes=limits.memory_mb * 2**20)
    remove_cgroups(groups)
    gaps = []
    if not groups.pids and os.geteuid() == 0 and not drops_to_nobody(groups):
        gaps.append("no process cap for the runs here: codila runs as root, no pids cgroup below its own is "
                    f"writable, and the jail cannot start as uid {NOBODY} (is the interpreter under a private "
                    "directory such as /root?); a program may fork until the machine's limit")
    if not groups.memory:
        gaps.append(f"memory is capped per process only ({limits.memory_mb} MiB each): no memory cgroup below "
                    "codila's own is writable, so a run's processes together may hold more")
    return gaps
