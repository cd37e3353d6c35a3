"""Several sequences decoded together: one DLM forward serves every row still decoding.

Each row runs the unchanged single-sequence sampler (dream, threshold or codila) in its own thread
against a :class:`RowDLM`. A row's ``logits(x)`` call becomes a request; when every row that is still
decoding has one pending, the last to arrive runs one batched forward and hands each row its slice.
Rows of different lengths are left-padded to the longest with Dream's padding convention (positions
count real tokens only; pads are masked out of attention), so every row sees exactly its own sequence.

Consequences, all tested (tests/test_batch.py):

* a row makes exactly the decisions it would make alone: a batch of N with seeds s..s+N−1 gives the
  canvases of N single runs with those seeds (the sampler code is the same code);
* per-row accounting: a row's ``forwards`` counts the forwards it took part in; :class:`Batcher`
  counts the shared forwards (``batched_forwards``), which is what the hardware paid for;
* a row that finishes leaves the batch, the others go on with a smaller one;
* calls that are not plain ``logits(x)`` (approximate KV caches, SDDC's pair masks) and the AR helper run
  per row, unbatched: their shapes differ from row to row. A decode with a KV cache would share no
  forward at all, so runtime.generate_many decodes such rows one after another (runtime.shares_forwards).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch


class Batcher:
    """Gathers the rows' forward requests into one batched forward (thread-safe)."""

    def __init__(self, dlm: Any, rows: int) -> None:
        self.dlm = dlm
        self.active = rows
        self.rows_per_forward: list[int] = []  # rows served by each batched forward
        self._cv = threading.Condition()
        self._pending: dict[int, torch.Tensor] = {}
        self._results: dict[int, torch.Tensor] = {}
        self._error: BaseException | None = None

    @property
    def batched_forwards(self) -> int:
        """DLM forwards the hardware ran (each shared by the rows then decoding)."""
        return len(self.rows_per_forward)

    def request(self, row: int, x: torch.Tensor) -> torch.Tensor:
        """x [1, n_row] → shifted fp32 logits [1, n_row, V] from a forward shared with the other rows."""
        with self._cv:
            self._pending[row] = x
            if len(self._pending) >= self.active:
                self._run()
            else:
                self._cv.wait_for(lambda: row in self._results or self._error is not None)
            if row not in self._results:
                raise RuntimeError("another row's batched forward failed") from self._error
            return self._results.pop(row)

    def leave(self) -> None:
        """A row is finished (or failed): the rest no longer wait for it."""
        with self._cv:
            self.active -= 1
            if self._pending and len(self._pending) >= self.active:
                self._run()

    def _run(self) -> None:  # lock held
        reqs, self._pending = self._pending, {}
        try:
            order = sorted(reqs)
            xs = [reqs[r][0] for r in order]
            n = max(len(x) for x in xs)
            pad_id = self.dlm.specials.eos
            batch = torch.full((len(xs), n), pad_id, dtype=xs[0].dtype, device=xs[0].device)
            keep = torch.zeros((len(xs), n), dtype=torch.long, device=xs[0].device)
            for i, x in enumerate(xs):
                batch[i, n - len(x) :] = x
                keep[i, n - len(x) :] = 1
            same = all(len(x) == n for x in xs)
            logits = self.dlm.logits(batch) if same else self.dlm.logits(batch, attention_mask=keep)
            self.rows_per_forward.append(len(xs))
            for i, (r, x) in enumerate(zip(order, xs)):
                self._results[r] = logits[i : i + 1, n - len(x) :]
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._cv.notify_all()


class RowDLM:
    """One row's view of the shared DLM: plain ``logits(x)`` goes through the batcher; anything else is
    the underlying denoiser's, unbatched. ``forwards`` counts this row's forwards only."""

    def __init__(self, batcher: Batcher, row: int) -> None:
        self._batcher, self._row = batcher, row
        self._dlm = batcher.dlm
        self.forwards = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dlm, name)

    def logits(self, x: torch.Tensor, *, rows: tuple[int, int] | None = None, **kwargs: Any) -> torch.Tensor:
        self.forwards += 1
        if kwargs and any(v is not None for v in kwargs.values()):
            return self._dlm.logits(x, rows=rows, **kwargs)
        out = self._batcher.request(self._row, x)  # the batch forward projects every row
        return out if rows is None else out[:, rows[0] : rows[1]]


class RowAR:
    """One row's view of the AR helper with its own forward counter (the helper runs per row)."""

    def __init__(self, ar: Any) -> None:
        self._ar = ar
        self.forwards = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ar, name)

    def forward(self, **kwargs: Any) -> Any:
        self.forwards += 1
        return self._ar.forward(**kwargs)


def run_batched(dlm: Any, rows: int, decode_row: Callable[[int, Any], Any]) -> tuple[list[Any], Batcher]:
    """Run ``decode_row(row, row_dlm)`` for rows 0..rows−1 side by side; returns (results, batcher).

    The first exception of any row is raised after every row has stopped.
    """
    batcher = Batcher(dlm, rows)
    results: list[Any] = [None] * rows
    errors: list[BaseException] = []

    def work(row: int) -> None:
        try:
            results[row] = decode_row(row, RowDLM(batcher, row))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)
        finally:
            batcher.leave()

    threads = [threading.Thread(target=work, args=(r,), name=f"codila-row-{r}", daemon=True) for r in range(rows)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise batcher._error if batcher._error is not None else errors[0]
    return results, batcher
