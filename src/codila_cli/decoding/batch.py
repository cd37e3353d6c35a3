"""Step-level batching: the model calls of many rows (requests) run as a few stacked forwards.

Each row runs the unchanged single-sequence sampler (dream, threshold, codila, DreamOn, SDDC) in its own thread,
against row views of the models (:class:`RowDLM`, :class:`RowAR`): each model call becomes a request to the
shared :class:`StepBatcher`. When every row that is still decoding
has a request waiting, the last to arrive runs the *step*: the requests are grouped by model and kind,
each group runs as one stacked forward (models/batched.py: the rows' tokens packed back to back, each
row with its own cached keys/values and its own positions), and each row gets its slice. Rows join at any step and leave when
their decode ends (continuous batching: a short request never waits for a long one to finish).

What is stacked (on the native engine of the bundled models; other engines run the same requests
row by row, in the same step):

* plain DLM forwards (``logits(x, rows=…)``: dream, threshold, codila without a cache, DreamOn);
* Fast-dLLM block-cache forwards, the refresh and the cached slice (models/dream.py::BlockCache),
  each row with its own cache, so the default CoDiLA setting batches too;
* the AR helper's forwards (decoding/soft_ar.py: the block prefill and each cached step).

Only the rows a caller reads are projected onto the vocabulary. SDDC's pair-masked forwards and FreeDave's
candidates (``logits_many``) run per row, inside the step. Consequences, tested in tests/test_batch.py:

* a row makes the decisions it would make alone (the sampler code is the same; a forward with other
  rows differs from a forward alone only in float summation order, and a request that is alone in its
  group runs as the row's own forward, bit for bit);
* per-row accounting: a row's ``forwards`` count its own model calls; :class:`StepBatcher` counts the
  forwards the hardware ran (``dlm_calls``, ``ar_calls``) and the rows each served;
* a row that fails, or is cancelled (:meth:`StepBatcher.cancel`: a client that went away), raises in its own
  thread only; the other rows go on. A stacked forward that fails is rerun row by row.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from codila_cli.engine.threads import use_threads
from codila_cli.models.batched import KVCall


class Cancelled(Exception):
    """The row was cancelled (its client went away, or its deadline passed)."""


@dataclass
class _Request:
    kind: str  # "dlm" | "ar" | "solo"
    model: Any  # the model the request runs on (group key)
    direct: Callable[[], Any]  # the row's own forward (bit-identical to decoding alone)
    call: KVCall | None = None  # the stackable form, when there is one
    finish: Callable[[Any], Any] | None = None  # turns (raw logits, kv) of a stacked run into direct()'s result
    owner: Any = None  # the DreamDenoiser of a plain DLM forward (stacked by padding on any engine)


class StepBatcher:
    """Gathers the rows' model calls into stacked forwards (thread-safe; rows join and leave at any time).

    One step runs at a time, in the thread of one of the waiting rows, as soon as every row still
    decoding has a request waiting, or the oldest waiting request has waited ``gather_s`` seconds. A
    row busy in its own Python
    (sampling, the helper's choice rules) then catches the next step instead of holding this one, and
    its work overlaps the running forward (torch releases the GIL). ``on_step(kind, rows)`` is called
    after each forward the hardware runs, with the rows it served.

    ``threads``: the CPU threads the steps share (None: the creating thread's); a step runs on ``narrow``
    = ``threads // lanes``, set in the thread that leads it (a thread's own count, engine/threads.py). ``wide``: a step whose lane is the only one with rows takes all ``threads`` (a
    lone request uses every core); only where the forwards' bits do not depend on the thread count
    (engine/threads.py::thread_invariant), so a row's text still does not depend on the other rows.
    ``stack`` False: every request runs its own forward inside the step (``serve --deterministic``: on
    a GPU a stacked GEMM rounds by batch size, so only a row's own forward is its lone result).
    """

    def __init__(self, *, on_step: Callable[[str, int], None] | None = None, gather_s: float = 0.01,
                 lanes: int = 1, threads: int | None = None, wide: bool = False, stack: bool = True) -> None:
        if lanes < 1:
            raise ValueError(f"lanes must be >= 1, got {lanes}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.lanes = lanes  # cohorts of rows whose steps may run at once (see :meth:`_ready`)
        self.threads = threads if threads is not None else torch.get_num_threads()
        self.narrow = max(1, self.threads // lanes)  # a step's threads while another lane has rows
        self.wide, self.stack = wide, stack
        self.wide_steps = 0  # steps that ran on all threads (a lone lane)
        self._cohort: dict[int, int] = {}  # row -> its lane, fixed at join (the emptiest lane)
        self._busy: set[int] = set()  # lanes running a step now
        self._count_lock = threading.Lock()
        self._lock = threading.Lock()
        self._wake: dict[int, threading.Condition] = {}  # row -> its own condition (on _lock): woken alone
        self._active: set[int] = set()
        self._cancelled: set[int] = set()
        self._pending: dict[int, tuple[float, _Request]] = {}
        self._results: dict[int, tuple[bool, Any]] = {}
        self._next = 0

        self.gather_s = gather_s
        self.on_step = on_step
        self.dlm_calls = 0  # DLM forwards the hardware ran (each shared by the rows then decoding)
        self.ar_calls = 0
        self.rows_per_forward: list[int] = []  # rows served by each DLM forward (bounded: see _record)

    @property
    def batched_forwards(self) -> int:
        """DLM forwards the hardware ran."""
        return self.dlm_calls

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._active)

    def join(self) -> int:
        """A new row; it takes part from the next step on."""
        with self._lock:
            row = self._next
            self._next += 1
            sizes = [sum(1 for r in self._active if self._cohort[r] == lane) for lane in range(self.lanes)]
            self._cohort[row] = sizes.index(min(sizes))
            self._wake[row] = threading.Condition(self._lock)
            self._active.add(row)
            return row

    @contextmanager
    def row(self, on_row: Callable[[StepBatcher, int], None] | None = None) -> Iterator[int]:
        """A row for the ``with`` block: joined on entry (``on_row(batcher, row)`` is told it, so a caller
        can cancel it), left on exit, however the block ends."""
        row = self.join()
        try:
            if on_row is not None:
                on_row(self, row)
            yield row
        finally:
            self.leave(row)

    def leave(self, row: int) -> None:
        """The row is finished (or failed, or cancelled): the others no longer wait for it."""
        with self._lock:
            lane = self._cohort.pop(row, None)
            self._active.discard(row)
            self._cancelled.discard(row)
            self._pending.pop(row, None)
            self._results.pop(row, None)
            self._wake.pop(row, None)
            if lane is not None:
                self._nudge(lane)  # its cohort may be ready without it

    def cancel(self, row: int) -> None:
        """Make the row's current or next request raise :class:`Cancelled` (from any thread)."""
        with self._lock:
            if row in self._active:
                self._cancelled.add(row)
                self._pending.pop(row, None)
                self._wake[row].notify()
                self._nudge(self._cohort[row])

    def request(self, row: int, req: _Request) -> Any:
        """Queue the row's call and wait for its result. The waiting row that finds the step ready (and
        no step running) runs it in its own thread: a row alone runs its own forward where it samples,
        with no hand-off."""
        with self._lock:
            if row in self._cancelled:
                raise Cancelled(f"row {row} was cancelled")
            self._pending[row] = (time.perf_counter(), req)
            lane, wake = self._rebalance(row), self._wake[row]
            while row not in self._results and row not in self._cancelled:
                if lane not in self._busy and self._ready(lane):
                    self._lead(lane)
                else:  # woken with its result, to lead a step (_nudge), or to look again after gather_s
                    wake.wait(timeout=None if lane in self._busy else self.gather_s)
            if row not in self._results:
                self._pending.pop(row, None)
                raise Cancelled(f"row {row} was cancelled")
            ok, value = self._results.pop(row)
        if not ok:
            raise value
        return value

    def _ready(self, lane: int) -> bool:  # lock held
        """A lane's step may start when every row of its cohort that is still decoding has its request
        waiting, or the oldest has waited ``gather_s``. With one lane the cohort is every row; with two,
        the cohorts' steps overlap: one cohort's forward runs while the other samples (each forward on
        cores/lanes threads: the server sets them)."""
        mine = [t for row, (t, _) in self._pending.items() if self._cohort.get(row) == lane]
        if not mine:
            return False
        waiting = sum(1 for r in self._active - self._cancelled if self._cohort[r] == lane)
        return len(mine) >= waiting or time.perf_counter() - min(mine) >= self.gather_s

    def _lead(self, lane: int) -> None:  # lock held; runs one step of the lane's cohort with the lock released
        reqs = {row: r for row, (_, r) in self._pending.items() if self._cohort.get(row) == lane}
        for row in reqs:
            del self._pending[row]
        self._busy.add(lane)
        alone = self.wide and self.lanes > 1 and all(self._cohort[r] == lane for r in self._active)
        self.wide_steps += alone
        self._lock.release()
        try:
            use_threads(self.threads if alone else self.narrow)
            results = self._step(reqs)  # other rows may queue their next request meanwhile
        finally:
            self._lock.acquire()
            self._busy.discard(lane)
        for row, res in results.items():
            if row in self._active and row not in self._cancelled:
                self._results[row] = res
                self._wake[row].notify()
        self._nudge(lane)

    def _rebalance(self, row: int) -> int:  # lock held; the row is between steps
        """The row's lane, after moving it to the emptiest lane when that one has two or more rows fewer
        (rows end at other times: without this, a lane whose rows finished leaves its core idle while the
        other lane steps several rows, issue 52). Which rows share a step does not change what a row
        decodes."""
        lane = self._cohort[row]
        if self.lanes > 1:
            sizes = [0] * self.lanes
            for r in self._active - self._cancelled:
                sizes[self._cohort[r]] += 1
            low = sizes.index(min(sizes))
            if sizes[lane] - sizes[low] >= 2:
                self._cohort[row] = low
                self._nudge(lane)  # its old cohort may be ready without it
                lane = low
        return lane

    def _nudge(self, lane: int) -> None:  # lock held
        """Wake the lane's oldest waiting row, if its step is not running: it leads the next step when the
        cohort is ready, else waits ``gather_s`` and looks again. Only that row wakes (every row waking at
        every step cost the other lane's forward its GIL: issue 52)."""
        if lane in self._busy:
            return
        mine = [(t, row) for row, (t, _) in self._pending.items() if self._cohort.get(row) == lane]
        if mine:
            self._wake[min(mine)[1]].notify()

    def _step(self, reqs: dict[int, _Request]) -> dict[int, tuple[bool, Any]]:
        groups: dict[tuple, list[int]] = {}
        for row in sorted(reqs):
            r = reqs[row]
            key = (r.kind, id(r.model)) if r.call is not None else ("solo", row)
            groups.setdefault(key, []).append(row)
        results: dict[int, tuple[bool, Any]] = {}
        for key, rows in groups.items():
            self._run_group(key[0], rows, [reqs[r] for r in rows], results)
        return results

    def _run_group(self, kind: str, rows: list[int], reqs: list[_Request], results: dict) -> None:
        from codila_cli.models import batched

        plain = all(r.owner is not None for r in reqs)
        if self.stack and len(reqs) > 1 and (batched.supports(reqs[0].model) or plain):
            try:
                if batched.supports(reqs[0].model):
                    outs = batched.run(reqs[0].model, [r.call for r in reqs], causal=kind == "ar")
                    self._record(kind, len(rows))
                else:  # another engine: plain forwards padded into one (Dream's padding convention)
                    outs = [None] * len(reqs)
                    for group in batched.stackable(reqs[0].owner, [r.call for r in reqs]):
                        for i, out in zip(group, batched.padded(reqs[0].owner, [reqs[i].call for i in group])):
                            outs[i] = out
                        self._record(kind, len(group))
                for row, r, out in zip(rows, reqs, outs):
                    results[row] = (True, r.finish(out))
                return
            except Exception:  # noqa: BLE001, S110 - rerun row by row: only the row at fault fails
                pass
        for row, r in zip(rows, reqs):
            try:
                results[row] = (True, r.direct())
            except BaseException as exc:  # noqa: BLE001 - raised in the row's own thread
                results[row] = (False, exc)
            self._record(kind, 1)

    def _record(self, kind: str, rows: int) -> None:
        with self._count_lock:  # steps of several lanes finish at once
            self._count(kind, rows)

    def _count(self, kind: str, rows: int) -> None:
        if kind == "ar":
            self.ar_calls += 1
        else:
            self.dlm_calls += 1
            if len(self.rows_per_forward) < 100_000:
                self.rows_per_forward.append(rows)
        if self.on_step is not None:
            self.on_step(kind, rows)


class RowDLM:
    """One row's view of a DLM: every forward goes through the batcher. ``forwards`` counts this row's."""

    def __init__(self, batcher: StepBatcher, row: int, dlm: Any) -> None:
        self._batcher, self._row, self._dlm = batcher, row, dlm
        self.forwards = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dlm, name)

    def logits(self, x: torch.Tensor, *, rows: tuple[int, int] | None = None, **kwargs: Any) -> torch.Tensor:
        self.forwards += 1
        dlm = self._dlm
        direct = (lambda: dlm.logits(x, rows=rows, **kwargs))
        if kwargs and any(v is not None for v in kwargs.values()):  # SDDC's pair masks: per row
            return self._batcher.request(self._row, _Request("solo", dlm, direct))
        call = KVCall(tokens=x[0], positions=torch.arange(x.shape[1], device=x.device), past=None,
                      keep=dlm.raw_rows(*(rows or (0, x.shape[1]))).to(x.device))
        return self._batcher.request(self._row, _Request("dlm", dlm.model, direct, call,
                                                         lambda out: dlm.emittable(out[0]), owner=dlm))

    def logits_many(self, xs: torch.Tensor, spans: list) -> list:  # FreeDave's candidates: the row's own forward
        self.forwards += 1
        return self._batcher.request(self._row, _Request("solo", self._dlm, lambda: self._dlm.logits_many(xs, spans)))

    def kv_call(self, ids: torch.Tensor, *, positions: Any | None, past: list | None, keep: torch.Tensor,
                want_kv: bool = False) -> tuple[torch.Tensor, list | None]:
        self.forwards += 1
        dlm = self._dlm
        n = ids.shape[1]
        pos = positions[0] if positions is not None else torch.arange(n, device=ids.device)
        call = KVCall(tokens=ids[0], positions=pos, past=past, keep=keep, want_kv=want_kv)

        def finish(out):
            logits, kv = out
            return dlm.emittable(logits), kv

        return self._batcher.request(self._row, _Request(
            "dlm", dlm.model, lambda: dlm.kv_call(ids, positions=positions, past=past, keep=keep, want_kv=want_kv),
            call, finish))


class RowAR:
    """One row's view of the AR helper: its forwards go through the batcher (``batcher`` None: straight
    to the helper, as before). ``forwards`` counts this row's."""

    def __init__(self, ar: Any, batcher: StepBatcher | None = None, row: int = 0) -> None:
        self._ar, self._batcher, self._row = ar, batcher, row
        self.forwards = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ar, name)

    def forward(self, *, inputs_embeds: Any, cache: Any | None, keep: int = 1) -> Any:
        self.forwards += 1
        ar = self._ar
        if self._batcher is None:
            return ar.forward(inputs_embeds=inputs_embeds, cache=cache, keep=keep)
        from codila_cli.models.native import new_cache

        past = [(layer.keys, layer.values) for layer in cache.layers] if cache is not None and cache.layers else None
        p = int(past[0][0].shape[2]) if past else 0
        n = int(inputs_embeds.shape[1])
        device = inputs_embeds.device
        call = KVCall(tokens=inputs_embeds[0], positions=torch.arange(p, p + n, device=device), past=past,
                      keep=torch.arange(n - keep, n, device=device), want_kv=True)

        def finish(out):
            logits, kv = out
            merged = new_cache(ar.model)
            for i, (k, v) in enumerate(kv):
                if past:
                    k, v = torch.cat([past[i][0], k], dim=2), torch.cat([past[i][1], v], dim=2)
                merged.update(k, v, i)
            ar.forwards += 1  # the helper's own counter, as a direct forward counts it
            return logits.float(), merged

        return self._batcher.request(self._row, _Request(
            "ar", ar.model, lambda: ar.forward(inputs_embeds=inputs_embeds, cache=cache, keep=keep), call, finish))


def run_batched(dlm: Any, rows: int, decode_row: Callable[[int, Any, StepBatcher], Any], *,
                batcher: StepBatcher | None = None) -> tuple[list[Any], StepBatcher]:
    """Run ``decode_row(i, row_dlm, batcher)`` for i = 0 … rows − 1 side by side; returns (results, batcher).
    Every row joins before any starts, so the first step serves them all. The first exception of any
    row is raised after every row has stopped."""
    batcher = batcher or StepBatcher()
    ids = [batcher.join() for _ in range(rows)]
    results: list[Any] = [None] * rows
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            use_threads(batcher.narrow)  # a new thread has no count of its own
            results[i] = decode_row(i, RowDLM(batcher, ids[i], dlm), batcher, ids[i])
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)
        finally:
            batcher.leave(ids[i])

    threads = [threading.Thread(target=work, args=(i,), name=f"codila-row-{i}", daemon=True) for i in range(rows)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results, batcher
