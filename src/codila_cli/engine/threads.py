"""How many CPU threads torch runs (``--threads N`` / ``CODILA_THREADS``, every command that decodes).

torch's own default is one thread per physical core. On a CPU that another process also uses, that
collapses: torch's parallel regions wait at a barrier for their slowest thread, and the thread that
shares its core with the other process is descheduled for whole scheduler slices, so every operator
waits for it (issue 50: `codila gen` 2.4–2.8 s idle, 6.4–9.2 s beside one `yes > /dev/null` on 2 cores;
with one thread, 2.7–3.3 s either way).

The default therefore never asks for every core: it takes the cores this process may use (CPU
affinity, and a cgroup's ``cpu.max`` quota in containers), less the other runnable tasks the kernel
counts right now (``/proc/loadavg``), less at least one, and never fewer than 1. ``codila serve``
keeps all usable cores (a server owns its machine; ``--threads`` caps it). Nothing here prints.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

MAX_THREADS = 1024


@dataclass(frozen=True)
class Threads:
    """The number torch runs and why (``Engine.threads``; ``-v`` prints the number)."""

    count: int
    why: str  # "asked" (--threads / CODILA_THREADS), or the default's reasoning


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by its cgroup's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cores, math.ceil(quota))) if quota else max(1, cores)


def _cgroup_quota() -> float | None:
    """cgroup v2 ``cpu.max`` (``max 100000`` = no quota) of this process's cgroup, in cores."""
    try:
        rel = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if line.startswith("0::"))
        quota, period = (Path("/sys/fs/cgroup") / rel.lstrip("/") / "cpu.max").read_text().split()
    except (OSError, StopIteration, ValueError, IndexError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def others_running() -> int:
    """Runnable tasks other than this process's, as the kernel counts them now (the fourth field of
    ``/proc/loadavg``, ``running/total``, counts this process's running thread too). 0 where unknown."""
    try:
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return 0
    return max(0, running - 1)


def default_threads(*, serve: bool = False) -> Threads:
    """The default (the module's rule): usable cores less the busy ones, less at least one, at least 1;
    all usable cores for a server."""
    cores = usable_cores()
    if serve:
        return Threads(cores, f"all {cores} usable core(s) (serve)")
    busy = others_running()
    count = max(1, cores - max(1, busy))
    return Threads(count, f"{cores} usable core(s), {busy} other runnable task(s) now, one core left free")


def choose_threads(asked: int | None, *, serve: bool = False) -> Threads:
    """``asked`` (``--threads`` or ``CODILA_THREADS``; None or 0 = auto), else :func:`default_threads`."""
    if asked is not None and not 0 <= asked <= MAX_THREADS:
        raise ValueError(f"threads must be from 0 (auto) to {MAX_THREADS}, got {asked}")
    return Threads(asked, "asked") if asked else default_threads(serve=serve)


def apply_threads(asked: int | None, *, serve: bool = False) -> Threads:
    """Choose (:func:`choose_threads`) and set torch's intra-op thread count; returns the choice."""
    import torch

    choice = choose_threads(asked, serve=serve)
    torch.set_num_threads(choice.count)
    return choice
