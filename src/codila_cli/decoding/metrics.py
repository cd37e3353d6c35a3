"""Metrics derived from a decoder's StepEvents alone (so the live view, --json and tests agree).

* ``tokens``: canvas slots committed by decoding (DLM or AR), excluding the end-of-text fill after an
  early stop; ``tokens_per_step`` = tokens / DLM forwards (a.k.a. tokens per forward, TPF).
* ``tokens_per_second`` = tokens / wall seconds of the decode loop (AR calls included).
* ``order_spearman``: Spearman correlation between the step at which each slot was committed and its
  position (1.0 = strictly left to right; ties share their average rank). CoDiLA Table 7.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from codila_cli.decoding.events import StepEvent


@dataclass
class Metrics:
    dlm_forwards: int = 0
    ar_forwards: int = 0
    tokens: int = 0
    tokens_by_ar: int = 0
    steps: int = 0
    tokens_per_step: float = 0.0
    tokens_per_second: float = 0.0
    wall_seconds: float = 0.0
    order_spearman: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0
        i = j + 1
    return ranks


def spearman(x: list[float], y: list[float]) -> float | None:
    if len(x) < 2:
        return None
    rx, ry = _ranks(x), _ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx) ** 0.5
    vy = sum((b - my) ** 2 for b in ry) ** 0.5
    return None if vx == 0 or vy == 0 else cov / (vx * vy)


class MetricsRecorder:
    """An ``on_step`` consumer; call :meth:`finish` with the loop's wall time."""

    def __init__(self) -> None:
        self.events: list[StepEvent] = []

    def __call__(self, event: StepEvent) -> None:
        self.events.append(event)

    def finish(self, *, wall_seconds: float, dlm_forwards: int, ar_forwards: int, limit: int | None = None) -> Metrics:
        """``limit``: the canvas slots the result keeps (a block decoder decodes whole blocks past the token
        limit; what lies past it is not counted as generated)."""
        work = [e for e in self.events if e.source != "fill"]
        if limit is not None:
            work = [e for e in work if any(p < limit for p in e.positions)]
        tokens = sum(sum(p < limit for p in e.positions) if limit is not None else len(e.positions) for e in work)
        pos, when = [], []
        for e in work:
            pos += list(e.positions)
            when += [e.step] * len(e.positions)
        return Metrics(
            dlm_forwards=dlm_forwards, ar_forwards=ar_forwards, tokens=tokens,
            tokens_by_ar=sum(sum(limit is None or p < limit for p in e.positions) for e in work if e.source == "ar"),
            steps=len(work), tokens_per_step=tokens / dlm_forwards if dlm_forwards else 0.0,
            tokens_per_second=tokens / wall_seconds if wall_seconds > 0 else 0.0,
            wall_seconds=wall_seconds, order_spearman=spearman([float(p) for p in pos], [float(w) for w in when]),
        )
