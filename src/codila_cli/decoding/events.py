"""Step events: the only thing decoders emit. The live view, the metrics and the tests read them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Source = Literal["dlm", "ar", "fill"]


@dataclass(frozen=True)
class StepEvent:
    """One commit of canvas positions.

    ``positions`` are canvas offsets (0 = first generated slot). ``source``: "dlm" (committed from the
    DLM's marginals), "ar" (written by the AR helper), "fill" (tail set to end-of-text after an early
    stop; not decoding work). ``canvas`` is the whole canvas after the step (mask id where masked).
    ``proposed``: (offset, token) for still-masked slots, the DLM's top-1 at its latest forward that
    scored them (what CoDiLA's helper reads as a plan); only for a listener (the live view), empty where
    the decoder does not say or nothing listens.
    """

    step: int
    positions: tuple[int, ...]
    tokens: tuple[int, ...]
    source: Source
    block: tuple[int, int] | None
    dlm_forwards: int
    ar_forwards: int
    elapsed: float
    canvas: tuple[int, ...]
    row: int = 0
    proposed: tuple[tuple[int, int], ...] = ()


OnStep = Callable[[StepEvent], None]


def no_op(_: StepEvent) -> None:
    return None
