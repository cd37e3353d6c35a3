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
# C0 controls but tab and newline, DEL, C1 controls: shown as visible escapes, never sent to the terminal
# (a file's ESC sequence could otherwise retitle or reprogram it)
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]}


def safe(text: str) -> str:
    """``text`` with its control characters (ESC, BEL, CR, …) as visible ``\\xNN`` escapes."""
    return text.translate(_CONTROLS)


class LiveView:
    def __init__(self, *, tokenizer: Any, mask_id: int, console: Any, block_width: int | None = None,
                 title: str = "codila", min_interval: float = 0.1, max_lines: int = 30) -> None:
        self.tokenizer = tokenizer
        self.mask_id = mask_id
        self.console = console
        self.block_width = block_width
        self.title = title
        self.min_interval = min_interval
        self.max_lines = max_lines
        self._pieces: dict[int, str] = {}
        self._special: set[int] = set()
        self._owner: dict[int, str] = {}
        self._last: StepEvent | None = None
        self._drawn = 0.0
        self._live = None
        self.redraws = 0

    def __enter__(self) -> LiveView:  # noqa: PYI034 -- subclasses return themselves too
        from rich.live import Live

        self._live = Live(console=self.console, transient=True, redirect_stdout=False, redirect_stderr=False,
                          auto_refresh=False)
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def piece(self, token: int) -> str:
        """Text of one token; control tokens become one dim glyph (∅ end-of-text, ⊕ expand, ◆ other)."""
        if token not in self._pieces:
            text = self.tokenizer.decode([token], skip_special_tokens=False)
            if text.startswith("<|") and text.endswith("|>") or text in ("<think>", "</think>"):
                self._special.add(token)
                text = {"<|endoftext|>": "∅", "<|expand|>": "⊕"}.get(text, "◆")
            self._pieces[token] = safe(text)
        return self._pieces[token]

    def __call__(self, event: StepEvent) -> None:
        for p in event.positions:
            self._owner[p] = event.source
        self._last = event
        self._redraw_if_due()

    def _redraw_if_due(self) -> None:
        """Redraw at most once per ``min_interval`` seconds (the view's whole cost)."""
        now = time.perf_counter()
        if self._live is not None and now - self._drawn >= self.min_interval:
            self._drawn = now
            self.redraws += 1
            self._live.update(self.render(), refresh=True)

    def _tail(self, text: Any) -> Any:
        """The last ``max_lines`` lines of a rich Text."""
        from rich.text import Text

        lines = text.split("\n")
        return Text("\n").join(lines[-self.max_lines :]) if len(lines) > self.max_lines else text

    def render(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        e = self._last
        if e is None:
            return Text()
        return Group(self._tail(self.tokens_text(e.canvas, self._owner, e.block)), Text(""), self.status(e), LEGEND())

    def tokens_text(self, canvas: tuple[int, ...], owner: dict[int, str], block: tuple[int, int] | None,
                    *, block_width: int | None = -1) -> Any:
        """Styled text of a canvas: masks as dim dots, DLM / AR tokens in their colours, the block underlined."""
        from rich.text import Text

        size = self.block_width if block_width == -1 else block_width
        text = Text()
        for i, tok in enumerate(canvas):
            if size and i and i % size == 0:
                text.append("▏", style="bright_black")
            in_block = block is not None and block[0] <= i < block[1]
            if tok == self.mask_id:
                text.append("·", style="bright_black underline" if in_block else "bright_black")
                continue
            style = STYLES.get(owner.get(i, "dlm"), "cyan") + (" underline bold" if in_block else "")
            piece = self.piece(tok)
            if tok in self._special:
                style = "bright_black" + (" underline" if in_block else "")
            if "\n" in piece:
                parts = piece.split("\n")
                for k, part in enumerate(parts):
                    text.append(part, style=style)
                    if k < len(parts) - 1:
                        text.append("↵\n", style="bright_black")
            else:
                text.append(piece, style=style)
        return text

    def status(self, e: StepEvent) -> Any:
        from rich.text import Text

        done = sum(1 for s in self._owner.values() if s != "fill")
        rate = f"{done / e.dlm_forwards:.2f}" if e.dlm_forwards else "-"
        speed = done / e.elapsed if e.elapsed > 0 else 0.0
        return Text(f"{self.title}  step {e.step + 1}  DLM forwards {e.dlm_forwards}  AR forwards "
                    f"{e.ar_forwards}  tokens/forward {rate}  {speed:.1f} tok/s", style="bold")


def LEGEND() -> Any:
    from rich.text import Text

    return Text.assemble(("·", "bright_black"), " masked  ", ("DLM", "cyan"), "  ", ("AR", "green"), "  ",
                         ("block", "underline"), "  ", ("∅", "bright_black"), " end of text")


class InfillView(LiveView):
    """`codila infill`: the middle being denoised between a few dim lines of the file around it.

    The middle changes length (expand turns one mask into two, delete removes a slot), so the owner of
    each committed token is carried over by aligning the previous middle with the new one.
    """

    def __init__(self, *, prefix: str, suffix: str, context_lines: int = 4, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.before = [safe(x) for x in prefix.split("\n")[-context_lines - 1 : -1]] if prefix else []
        self.after = [safe(x) for x in suffix.split("\n")[:context_lines]] if suffix else []
        self._canvas: tuple[int, ...] = ()

    def __call__(self, event: StepEvent) -> None:
        if len(event.canvas) != len(self._canvas) and self._owner:
            from difflib import SequenceMatcher

            moved: dict[int, str] = {}
            for a, b, n in SequenceMatcher(None, self._canvas, event.canvas, autojunk=False).get_matching_blocks():
                for k in range(n):
                    if a + k in self._owner:
                        moved[b + k] = self._owner[a + k]
            self._owner = moved
        self._canvas = event.canvas
        super().__call__(event)

    def render(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        e = self._last
        if e is None:
            return Text()
        middle = self._tail(self.tokens_text(e.canvas, self._owner, e.block, block_width=None))
        ctx = lambda rows: Text("\n".join(rows), style="bright_black")
        return Group(ctx(self.before), middle, ctx(self.after), Text(""),
                     self.status(e).append(f"  middle {len(e.canvas)} slots"), LEGEND())


class PlanView(LiveView):
    """`codila plan`: one row for the contract, then one row per unit canvas, all denoised together.

    Events carry ``row``: 0 is the contract, k + 1 is unit k (decoding/sddc.py)."""

    def __init__(self, *, unit_lines: int = 4, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.unit_lines = unit_lines
        self._rows: dict[int, tuple[tuple[int, ...], dict[int, str]]] = {}
        self._committed = 0

    def __call__(self, event: StepEvent) -> None:
        _, owner = self._rows.get(event.row, ((), {}))
        for p in event.positions:
            owner[p] = event.source
        self._rows[event.row] = (event.canvas, owner)
        self._committed += len(event.positions)
        self._last = event
        self._redraw_if_due()

    def render(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        e = self._last
        if e is None:
            return Text()
        parts: list[Any] = []
        for row in sorted(self._rows):
            canvas, owner = self._rows[row]
            body = self.tokens_text(canvas, owner, None, block_width=None)
            lines = body.split("\n")
            limit = self.max_lines if row == 0 else self.unit_lines
            if len(lines) > limit:
                body = Text("\n").join(lines[:limit] + [Text("…", style="bright_black")])
            left = sum(1 for t in canvas if t == self.mask_id)
            label = "contract" if row == 0 else f"unit {row}"
            parts += [Text(f"── {label} ({left} masked) ", style="bold"), body]
        rate = f"{self._committed / e.dlm_forwards:.2f}" if e.dlm_forwards else "-"
        parts += [Text(""), Text(f"{self.title}  DLM forwards {e.dlm_forwards}  tokens/forward {rate}  "
                                 f"{self._committed / e.elapsed if e.elapsed > 0 else 0.0:.1f} tok/s", style="bold"),
                  LEGEND()]
        return Group(*parts)


def view_block(cfg: Any) -> int | None:
    """The block grid the live view draws: the width of the blocks ``cfg``'s decoder works in (the knob
    table's ``grid`` knob), none for a decoder without blocks (dream)."""
    from codila_cli.decoding.config import GEN_KNOBS
    from codila_cli.decoding.knobs import block_width

    return block_width(GEN_KNOBS, cfg)
