"""Rich live view of a canvas being denoised, driven only by the decoders' StepEvents.

Shown on stderr and only when stderr is a terminal (never with --json or -q). Masked slots are dim
dots; tokens committed by the DLM are cyan; tokens written by the AR helper are green; the block being
decoded is underlined; block boundaries are a dim ``▏``. A status line shows step, DLM forwards,
tokens per forward and tokens/s. Redraws are throttled (``min_interval``) so the view costs little.
"""

from __future__ import annotations

import time
from typing import Any

from codila_cli.decoding.events import StepEvent

STYLES = {"dlm": "cyan", "ar": "green", "fill": "bright_black"}


class LiveView:
    def __init__(self, *, tokenizer: Any, mask_id: int, console: Any, block_size: int | None = None,
                 title: str = "codila", min_interval: float = 0.1, max_lines: int = 30) -> None:
        self.tokenizer = tokenizer
        self.mask_id = mask_id
        self.console = console
        self.block_size = block_size
        self.title = title
        self.min_interval = min_interval
        self.max_lines = max_lines
        self._pieces: dict[int, str] = {}
        self._owner: dict[int, str] = {}
        self._last: StepEvent | None = None
        self._drawn = 0.0
        self._live = None
        self.redraws = 0

    def __enter__(self) -> "LiveView":
        from rich.live import Live

        self._live = Live(console=self.console, transient=True, redirect_stdout=False, redirect_stderr=False,
                          auto_refresh=False)
        self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def piece(self, token: int) -> str:
        if token not in self._pieces:
            self._pieces[token] = self.tokenizer.decode([token], skip_special_tokens=False)
        return self._pieces[token]

    def __call__(self, event: StepEvent) -> None:
        for p in event.positions:
            self._owner[p] = event.source
        self._last = event
        now = time.perf_counter()
        if self._live is not None and now - self._drawn >= self.min_interval:
            self._drawn = now
            self.redraws += 1
            self._live.update(self.render(), refresh=True)

    def render(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        e = self._last
        text = Text()
        if e is None:
            return text
        block = e.block
        for i, tok in enumerate(e.canvas):
            if self.block_size and i and i % self.block_size == 0:
                text.append("▏", style="bright_black")
            in_block = block is not None and block[0] <= i < block[1]
            if tok == self.mask_id:
                text.append("·", style="bright_black underline" if in_block else "bright_black")
                continue
            style = STYLES.get(self._owner.get(i, "dlm"), "cyan") + (" underline bold" if in_block else "")
            piece = self.piece(tok)
            if "\n" in piece:
                parts = piece.split("\n")
                for k, part in enumerate(parts):
                    text.append(part, style=style)
                    if k < len(parts) - 1:
                        text.append("↵\n", style="bright_black")
            else:
                text.append(piece, style=style)
        lines = text.split("\n")
        if len(lines) > self.max_lines:
            text = Text("\n").join(lines[-self.max_lines :])
        done = sum(1 for s in self._owner.values() if s != "fill")
        rate = f"{done / e.dlm_forwards:.2f}" if e.dlm_forwards else "-"
        speed = done / e.elapsed if e.elapsed > 0 else 0.0
        status = Text(f"{self.title}  step {e.step + 1}  DLM forwards {e.dlm_forwards}  AR forwards "
                      f"{e.ar_forwards}  tokens/forward {rate}  {speed:.1f} tok/s", style="bold")
        legend = Text.assemble(("·", "bright_black"), " masked  ", ("DLM", "cyan"), "  ", ("AR", "green"), "  ",
                               ("block", "underline"))
        return Group(text, Text(""), status, legend)
