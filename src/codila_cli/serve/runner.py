"""The server's side of the engine: admission (``--max-batch`` rows decoding, ``--max-queue`` waiting),
one worker thread per running request, deadlines, cancellation, streaming, and the metrics.

Every request decodes as rows of the engine's shared step batcher, so requests that arrive while
others decode join them at the next step; a request alone runs its own forwards, bit for bit as
``codila gen``. A cancelled request (its client went away, its deadline passed, the server stops)
raises in its own row at its next model call and leaves the batch; no other row is touched.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any


class QueueFull(Exception):
    """Every batch slot is taken and the queue is full (HTTP 429)."""


class DeadlineExceeded(Exception):
    """The request ran past its deadline and was cancelled (HTTP 504)."""


@dataclass(eq=False)
class Ticket:
    """One running request's rows, so that it can be cancelled from any thread."""

    rows: list[tuple[Any, int]] = field(default_factory=list)
    cancelled: bool = False
    reason: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def on_row(self, batcher: Any, row: int) -> None:
        from codila_cli.decoding.batch import Cancelled

        with self._lock:
            self.rows.append((batcher, row))
            if self.cancelled:
                batcher.cancel(row)
                raise Cancelled(self.reason)

    def cancel(self, reason: str) -> None:
        with self._lock:
            if not self.cancelled:
                self.cancelled, self.reason = True, reason
            for batcher, row in self.rows:
                batcher.cancel(row)


class Metrics:
    """Prometheus metrics of one server (its own registry)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.requests = Counter("codila_requests", "Requests answered, by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("codila_prompt_tokens", "Prompt tokens read", registry=r)
        self.tokens = Counter("codila_generated_tokens", "Tokens generated (up to the end of the text)", registry=r)
        self.forwards = Counter("codila_forwards", "Model forwards the hardware ran, by model kind", ["kind"], registry=r)
        self.batch_rows = Histogram("codila_batch_rows", "Rows served by one forward", ["kind"],
                                    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64), registry=r)
        self.queue = Gauge("codila_queue_length", "Requests waiting for a batch slot", registry=r)
        self.running = Gauge("codila_running_requests", "Requests decoding now", registry=r)
        self.latency = Histogram("codila_request_seconds", "Time from admission to the last token", ["endpoint"],
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300), registry=r)
        self.first_chunk = Histogram("codila_first_chunk_seconds", "Time to the first streamed text",
                                     buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30), registry=r)
        self.cancelled = Counter("codila_cancelled", "Requests cancelled, by reason", ["reason"], registry=r)
        # per generation or fill: the DLM forwards it waited for one after another (a FreeDave verification of
        # several candidates is one: --exact), and the canvases they evaluated; tokens per sequential forward =
        # codila_generated_tokens / this
        self.sequential = Counter("codila_sequential_dlm_forwards", "DLM forwards a generation or fill waited for "
                                  "in sequence, by whether it decoded exactly in fewer (FreeDave: --exact)", ["freedave"], registry=r)
        self.canvases = Counter("codila_dlm_canvases", "Canvases those forwards evaluated", ["freedave"], registry=r)
        self.exact_tokens = Counter("codila_generated_tokens_by_mode", "Tokens generated, by whether the "
                                    "generation or fill decoded exactly in fewer forwards", ["freedave"], registry=r)

    def on_batch(self, kind: str, rows: int) -> None:
        kind = "ar" if kind == "ar" else "dlm"
        self.forwards.labels(kind).inc()
        self.batch_rows.labels(kind).observe(rows)

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class Runner:
    """Admits requests and runs each in a worker thread; ``max_batch`` rows decode at once (a request
    with ``n`` choices takes n), ``max_queue`` more may wait; ``deadline_s`` bounds each request."""

    def __init__(self, engine: Any, *, max_batch: int, max_queue: int, deadline_s: float, metrics: Metrics) -> None:
        self.engine, self.metrics = engine, metrics
        self.max_batch, self.max_queue, self.deadline_s = max_batch, max_queue, deadline_s
        self._free = max_batch
        self._waiting = 0
        self._wakeups: list[asyncio.Future] = []  # waiting requests, woken when slots are released
        self.narrow = engine.batcher.narrow  # made here, once: request threads would race to make it
        self._pool = ThreadPoolExecutor(max_workers=max_batch * 2 + 2, thread_name_prefix="codila-request",
                                        initializer=self._thread_start)
        self._tickets: set[Ticket] = set()
        self.stopping = False

    @property
    def in_use(self) -> int:
        """Batch slots taken by admitted requests."""
        return self.max_batch - self._free

    async def admit(self, rows: int, *, since: float | None = None) -> None:
        """Wait for ``rows`` batch slots, or raise QueueFull at once when the queue is full; the wait counts
        against the request's deadline (from ``since``, its arrival on ``time.monotonic``): past it,
        DeadlineExceeded, so a queued request is answered within ``--timeout`` too. No lock: the event
        loop is one thread, and :meth:`release` must never wait (a cancelled stream releases its slots)."""
        end = (time.monotonic() if since is None else since) + self.deadline_s
        if self.stopping:
            raise QueueFull("the server is shutting down")
        if self._free < rows and self._waiting >= self.max_queue:
            raise QueueFull(f"{self.max_batch} requests are decoding and {self._waiting} are waiting")
        self._waiting += 1
        self.metrics.queue.set(self._waiting)
        try:
            while self._free < rows and not self.stopping:
                wake = asyncio.get_running_loop().create_future()
                self._wakeups.append(wake)
                try:
                    await asyncio.wait_for(wake, timeout=max(0.0, end - time.monotonic()))
                except asyncio.TimeoutError:
                    self.metrics.cancelled.labels("deadline").inc()
                    raise DeadlineExceeded(f"the request waited past the server's deadline of {self.deadline_s:g} s "
                                           "for a batch slot") from None
                finally:
                    if wake in self._wakeups:
                        self._wakeups.remove(wake)
            if self.stopping:
                raise QueueFull("the server is shutting down")
            self._free -= rows
        finally:
            self._waiting -= 1
            self.metrics.queue.set(self._waiting)
        self.metrics.running.inc(rows)

    def _thread_start(self) -> None:
        """A request thread runs torch on its lane's share of the threads (engine/threads.py: MKL's count
        is per thread, and a thread that sets none runs on every core); each step it leads sets it again."""
        from codila_cli.engine.threads import use_threads

        use_threads(self.narrow)

    def release(self, rows: int) -> None:
        """Give back ``rows`` slots and wake the waiting requests; never waits (on the event loop's thread)."""
        self._free += rows
        self.metrics.running.dec(rows)
        self._wake()

    def _wake(self) -> None:
        wakeups, self._wakeups = self._wakeups, []
        for wake in wakeups:
            if not wake.done():
                wake.set_result(None)

    def ticket(self) -> Ticket:
        t = Ticket()
        self._tickets.add(t)
        return t

    def done(self, t: Ticket) -> None:
        self._tickets.discard(t)

    async def call(self, fn: Callable[[], Any], ticket: Ticket, *, watch: Callable[[], Any] | None = None,
                   since: float | None = None) -> Any:
        """Run ``fn`` in a worker thread; cancel its rows when the deadline (``deadline_s`` from ``since``,
        the request's arrival, else now) passes or ``watch()`` (an async predicate: the client went away)
        turns true."""
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._pool, fn)
        deadline = (time.monotonic() if since is None else since) + self.deadline_s
        try:
            while True:
                try:
                    return await asyncio.wait_for(asyncio.shield(fut), timeout=0.25)
                except asyncio.TimeoutError:
                    pass
                late = time.monotonic() > deadline
                if late or (watch is not None and await watch()):
                    reason = "deadline" if late else "disconnected"
                    ticket.cancel(reason)
                    self.metrics.cancelled.labels(reason).inc()
                    await asyncio.wait([fut])  # the rows end at their next model call
                    fut.exception()  # retrieved: nobody reads a cancelled request's result
                    if late:
                        raise DeadlineExceeded(f"the request ran past the server's deadline of {self.deadline_s:g} s")
                    return None
        except asyncio.CancelledError:
            ticket.cancel("cancelled")
            self.metrics.cancelled.labels("cancelled").inc()
            raise

    def stop_now(self) -> None:
        """At SIGTERM, before the server waits for its connections: refuse new requests and cancel the
        running ones, so every stream ends at once with an error event instead of being cut later."""
        self.stopping = True
        for t in list(self._tickets):
            t.cancel("shutdown")

    async def shutdown(self) -> None:
        """Refuse new requests and cancel the running ones (their rows end at their next model call)."""
        self.stopping = True
        for t in list(self._tickets):
            t.cancel("shutdown")
        self._wake()
        self._pool.shutdown(wait=False, cancel_futures=True)
