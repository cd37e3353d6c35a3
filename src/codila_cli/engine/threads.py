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

The count is partly per thread: MKL's matrix products (torch's fp32 CPU GEMMs) read a thread-local
count, and a thread that never set one runs them on every core, whatever the main thread chose. A
worker thread that decodes therefore sets its own (:func:`use_threads`; decoding/batch.py does it for
every step it runs). Whether a forward's bits depend on the count is :func:`thread_invariant`'s
question: MKL's strict reproducible mode (``MKL_CBWR=AUTO,STRICT``, :func:`reproducible_gemm`) makes
its GEMMs give the same bits on any number of threads; the check verifies it on the loaded models.
``codila serve`` sets it (a request alone there takes every core, so its bits must not depend on the
count). The other commands keep MKL's default mode, the arithmetic the parity goldens were made with
(strict mode rounds fp32 GEMMs otherwise in the last bit: tests/test_parity.py's fingerprint differs).
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_THREADS = 1024


@dataclass(frozen=True)
class Threads:
    """The number torch runs and why (``Engine.threads``; ``-v`` prints the number)."""

    count: int
    why: str  # "asked" (--threads / CODILA_THREADS), or the default's reasoning
    warning: str | None = None  # an asked count over the cores free now: what it will cost


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
    return Threads(asked, "asked", over_free(asked, serve=serve)) if asked else default_threads(serve=serve)


def over_free(asked: int, *, serve: bool = False) -> str | None:
    """Why ``asked`` threads will run slowly here (None: they fit): more than the usable cores, or (not for
    a server, which owns its machine) more than the cores other processes leave free right now, where
    torch's threads wait at every operator for the one that shares a core (issue 63: 5.0 against 49.4
    tokens/s with --threads 2 and 1 on a busy 2-core machine)."""
    cores = usable_cores()
    if asked > cores:
        return (f"--threads {asked} is more than the {cores} core(s) this process may use: the extra threads share "
                f"cores and every step waits for them (--threads 0 picks for you)")
    busy = others_running()
    free = max(1, cores - busy)
    if not serve and asked > free:
        return (f"--threads {asked} with {busy} other task(s) running on {cores} core(s), {free} free now: each step "
                f"waits for the thread that shares a core, several times slower (10x measured on a busy 2-core "
                f"machine); --threads {free} or 0 (auto) avoids it")
    return None


def apply_threads(asked: int | None, *, serve: bool = False) -> Threads:
    """Choose (:func:`choose_threads`) and set torch's intra-op thread count; returns the choice."""
    import torch

    choice = choose_threads(asked, serve=serve)
    torch.set_num_threads(choice.count)
    return choice


_local = threading.local()  # the count this thread last set (use_threads)


def use_threads(n: int) -> None:
    """Run this thread's torch operators on ``n`` threads (a no-op when this thread already set ``n``)."""
    import torch

    if getattr(_local, "n", None) != n or torch.get_num_threads() != n:  # another caller may have set one since
        torch.set_num_threads(n)
        _local.n = n


def reproducible_gemm() -> None:
    """Ask MKL for GEMMs whose bits do not depend on the thread count (strict CNR mode, MKL 2019.3+),
    unless the user set ``MKL_CBWR`` already. MKL reads it at its first GEMM, so call this before one."""
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")


CHECK_LENGTHS = (1, 3, 5, 17)  # token counts of the probe forwards (MKL picks other kernels for 1-3 rows)


def thread_invariant(models: list[Any], *, narrow: int, wide: int) -> bool:
    """Whether each model's forward gives the same bits on ``wide`` threads as on ``narrow`` (probe
    forwards of :data:`CHECK_LENGTHS` random tokens, on CPU). A server lets a lone request take every
    core only where this holds, so a text never depends on whether another request was running. It
    runs in the calling thread and leaves it on ``narrow`` threads."""
    import torch

    if wide == narrow:
        return True
    gen = torch.Generator().manual_seed(0)
    try:
        for model in models:
            vocab = model.get_input_embeddings().weight.shape[0]
            for n in CHECK_LENGTHS:
                ids = torch.randint(0, vocab, (1, n), generator=gen)
                outs = []
                for count in (narrow, wide):
                    use_threads(count)
                    with torch.inference_mode():
                        outs.append(model(input_ids=ids).logits)
                if not torch.equal(*outs):
                    return False
        return True
    finally:
        use_threads(narrow)
