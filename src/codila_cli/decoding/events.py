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


OnStep = Callable[[StepEvent], None]


def no_op(_: StepEvent) -> None:
    return None
