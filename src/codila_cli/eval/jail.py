"""The OS jail generated programs run in: bubblewrap (``bwrap``, packaged by Debian, Ubuntu, Fedora…).

Each run gets new user, PID, mount, network, IPC, UTS and cgroup namespaces (``--unshare-all``), all
capabilities dropped, uid/gid 65534 inside, and a file system of its own: the interpreter's prefix and
``/usr`` (and the ``/lib*``/``/bin`` trees where they are real directories) read-only, a fresh ``/proc``
that shows only the run's own processes, a minimal ``/dev``, a private ``/tmp``, and the run's directory
(``/sandbox``) as the only writable place. The environment is cleared. When the run's first process
(the namespace's init) ends, the kernel kills every process left in the PID namespace, so nothing a
program starts outlives it. A cap on processes: RLIMIT_NPROC where it binds (not for root, whose
processes it does not count), else a ``pids`` cgroup when one is writable (:func:`pids_cgroup`).

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


def interpreter() -> tuple[str, str]:
    """(the real Python binary, its installation prefix): the stdlib-only interpreter a program runs on
    (a virtual environment's site-packages are not part of the jail)."""
    return os.path.realpath(sys.executable), os.path.realpath(sys.base_prefix)


@lru_cache(maxsize=1)
def detect() -> Jail:
    """bubblewrap if it is installed and can run the interpreter in a full set of namespaces here."""
    path = shutil.which("bwrap")
    if path is None:
        return Jail("none", why="bwrap (bubblewrap) is not installed")
    try:
        r = subprocess.run([*command(path, Path("/"), probe=True), "-I", "-c", "print('ok')"], capture_output=True,
                           text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Jail("none", why=f"bwrap does not start ({exc})")
    if r.returncode != 0 or r.stdout.strip() != "ok":
        return Jail("none", why=f"bwrap cannot create namespaces here ({(r.stderr or r.stdout).strip()[:160]})")
    return Jail("bwrap", path)


def command(bwrap: str, workdir: Path, *, probe: bool = False) -> list[str]:
    """The bwrap command line up to the interpreter (the caller appends its arguments)."""
    python, prefix = interpreter()
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
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    if not probe:
        args += ["--bind", str(workdir), "/sandbox", "--chdir", "/sandbox"]
    return [*args, "--", python]


def pids_cgroup(limit: int) -> Path | None:
    """A new ``pids`` cgroup (v2, or v1's pids hierarchy) with ``pids.max = limit``, when this process may
    create one; the caller moves the run into it and removes it afterwards. None where none is writable."""
    candidates = [Path("/sys/fs/cgroup")] if Path("/sys/fs/cgroup/cgroup.controllers").is_file() else []
    candidates.append(Path("/sys/fs/cgroup/pids"))
    for root in candidates:
        if root.name != "pids" and "pids" not in (root / "cgroup.subtree_control").read_text(errors="ignore"):
            continue
        try:
            group = root / f"codila-{os.getpid()}-{os.urandom(4).hex()}"
            group.mkdir()
            (group / "pids.max").write_text(str(limit))
            return group
        except OSError:
            continue
    return None


def remove_cgroup(group: Path | None) -> None:
    """Remove the run's cgroup once the kernel has reaped its processes (a few tries)."""
    import time

    for _ in range(50) if group is not None else ():
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.02)
