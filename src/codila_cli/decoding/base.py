"""Shared bookkeeping for every decoder loop: the canvas, NFE counters, events, early stop."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from codila_cli.decoding.events import OnStep, Source, StepEvent, no_op
from codila_cli.decoding.marginals import first_stop
from codila_cli.decoding.stops import ends_line, stop_offset

if TYPE_CHECKING:
    from codila_cli.decoding.config import CodilaConfig, DreamConfig, ThresholdConfig


@dataclass
class DecodeResult:
    """Final canvas (generated slots only) and raw counters; metrics are derived from the events."""

    canvas: list[int]
    dlm_forwards: int
    ar_forwards: int
    steps: int
    seconds: float
    stopped_early: bool
    dlm_rows: int | None = None  # canvases the DLM evaluated (decoding/freedave.py); None: one a forward
    freedave: dict | None = None  # decoding/freedave.py's counts (rows, guarded, drafted, accepted)

    def __post_init__(self) -> None:
        if self.dlm_rows is None:
            self.dlm_rows = self.dlm_forwards


@dataclass
class Canvas:
    """``x`` = prompt ++ canvas, shape [1, P + L]; commits go through :meth:`commit`, which emits events."""

    x: torch.Tensor
    prompt_len: int
    mask_id: int
    stop_ids: tuple[int, ...]
    fill_id: int
    on_step: OnStep
    dlm: object  # anything with a ``forwards`` counter
    ar: object | None = None
    step: int = 0
    t0: float = field(default_factory=time.perf_counter)
    stopped_early: bool = False
    dlm0: int = 0  # forward counters at start, so events and results count this run only
    ar0: int = 0
    stop_lines: tuple[str, ...] = ()  # decoding/stops.py: a generated line starting with one ends the output
    early_stop: bool = True  # end at a stop token or a stop line (else decode the whole canvas)
    at_line_start: bool = True  # the prompt ends a line (only read with stop_lines)
    _checked: int = 0  # length of the committed prefix last checked for a stop line
    _proposed: dict = field(default_factory=dict)  # offset -> the DLM's latest top-1 (StepEvent.proposed)

    @classmethod
    def start(cls, *, prompt_ids: list[int], config: DreamConfig | ThresholdConfig | CodilaConfig, dlm, ar=None,
              on_step: OnStep, fill_id: int | None = None) -> Canvas:
        """The prompt and ``config.max_new_tokens`` masks; ``config``'s stop lines and early stop apply
        (any of decoding/config.py's generation configs: the one place a decoder's canvas reads them)."""
        sp, length, stop_lines = dlm.specials, config.max_new_tokens, config.stop
        device = getattr(dlm, "device", torch.device("cpu"))
        x = torch.tensor([list(prompt_ids) + [sp.mask] * length], dtype=torch.long, device=device)
        return cls(x=x, prompt_len=len(prompt_ids), mask_id=sp.mask, stop_ids=sp.stop_ids,
                   fill_id=sp.eos if fill_id is None else fill_id, on_step=on_step, dlm=dlm, ar=ar,
                   dlm0=dlm.forwards, ar0=ar.forwards if ar is not None else 0, stop_lines=tuple(stop_lines),
                   early_stop=config.early_stop,
                   at_line_start=ends_line(dlm.tokenizer, list(prompt_ids)) if stop_lines else True)

    @property
    def dlm_forwards(self) -> int:
        return self.dlm.forwards - self.dlm0

    @property
    def ar_forwards(self) -> int:
        return (self.ar.forwards - self.ar0) if self.ar is not None else 0

    @property
    def completion_start(self) -> int:
        """Where the completion begins in ``x`` (a view from an offset keeps this one)."""
        return self.prompt_len

    @property
    def gen(self) -> torch.Tensor:
        """View of the generated slots [L]."""
        return self.x[0, self.prompt_len :]

    def masked(self) -> torch.Tensor:
        return self.gen == self.mask_id

    def commit(self, positions: torch.Tensor, tokens: torch.Tensor, *, source: Source,
               block: tuple[int, int] | None = None) -> None:
        """Write ``tokens`` at canvas offsets ``positions``, emit one StepEvent, advance the step."""
        if len(positions) == 0:
            return
        if bool((tokens == self.mask_id).any()):  # would never unmask: every decoder loop must make progress
            raise RuntimeError(f"decoder bug: {source} tried to commit the mask token")
        self.gen[positions] = tokens.to(self.x.dtype)
        self._emit(positions, tokens, source, block)
        self.step += 1

    @property
    def wants_proposals(self) -> bool:
        """Whether anything listens for the DLM's proposals (a decoder skips :meth:`propose` if not)."""
        return self.on_step is not no_op

    def propose(self, positions: torch.Tensor, tokens: torch.Tensor) -> None:
        """The DLM's current top-1 ``tokens`` at canvas offsets ``positions`` (StepEvent.proposed)."""
        self._proposed.update(zip(positions.tolist(), tokens.tolist(), strict=True))

    def _emit(self, positions, tokens, source: Source, block) -> None:
        canvas = tuple(self.gen.tolist())  # one copy each
        proposed = tuple((p, t) for p, t in self._proposed.items() if canvas[p] == self.mask_id) if self._proposed else ()
        self.on_step(StepEvent(
            step=self.step, positions=tuple(positions.tolist()), tokens=tuple(tokens.tolist()),
            source=source, block=block, dlm_forwards=self.dlm_forwards, ar_forwards=self.ar_forwards,
            elapsed=time.perf_counter() - self.t0, canvas=canvas, proposed=proposed))

    def done(self) -> bool:
        """True when nothing is masked, or (early stop) a stop token or a stop line (``stop_lines``) is in
        the fully committed prefix; then the remaining masked tail is filled with end-of-text and
        reported as a "fill" event."""
        masked = self.masked()
        if not bool(masked.any()):
            return True
        if not self.early_stop:
            return False
        if first_stop(self.gen, mask_id=self.mask_id, stop_ids=self.stop_ids) is None and not self._stop_line(masked):
            return False
        tail = masked.nonzero().flatten()
        self.gen[tail] = self.fill_id
        self._emit(tail, torch.full_like(tail, self.fill_id), "fill", None)
        self.stopped_early = True
        return True

    def _stop_line(self, masked: torch.Tensor) -> bool:
        """Whether the committed prefix's text holds a stop line (decoded only when the prefix grew)."""
        if not self.stop_lines:
            return False
        n = int(masked.nonzero()[0])  # masked.any() holds here
        if n == self._checked:
            return False
        self._checked = n
        text = self.dlm.tokenizer.decode(self.gen[:n].tolist(), skip_special_tokens=True)
        return stop_offset(text, self.stop_lines, at_line_start=self.at_line_start) is not None

    def result(self) -> DecodeResult:
        return DecodeResult(canvas=self.gen.tolist(), dlm_forwards=self.dlm_forwards, ar_forwards=self.ar_forwards,
                            steps=self.step, seconds=time.perf_counter() - self.t0, stopped_early=self.stopped_early)
