"""Rich live view of a canvas being denoised, driven only by the decoders' StepEvents.

Shown on stderr and only when stderr is a terminal (never with --json or -q). Every kind of slot has a
look that holds without colour too (``NO_COLOR``, a monochrome terminal), and a colour where there is one:

* masked, nothing proposed yet (or only blank space, such as the line breaks a DLM proposes far from the
  text): a dim dot ``·``;
* proposed by the DLM but not committed (its current top-1, the plan the helper reads): dim italic, yellow;
* committed by the DLM: plain, cyan;
* written by the AR helper (CoDiLA): bold, green;
* the block being written: underlined; block boundaries a dim ``▏``; control tokens one dim glyph.

The status line (step, forwards, tokens per forward, tokens/s) and the legend always fit: the canvas
is folded to the terminal's width and only as many of its rows as the terminal has room for are shown,
around the block being written, so a canvas taller than the terminal scrolls instead of pushing the
status off screen. Redraws are throttled (``min_interval``) so the view costs little.
"""

from __future__ import annotations

import time
from typing import Any

from codila_cli.decoding.events import StepEvent

STYLES = {"dlm": "cyan", "ar": "bold green", "fill": "bright_black", "proposed": "italic dim yellow",
          "masked": "bright_black"}
# C0 controls but tab and newline, DEL, C1 controls: shown as visible escapes, never sent to the terminal
# (a file's ESC sequence could otherwise retitle or reprogram it)
_CONTROLS = {c: f"\\x{c:02x}" for c in [*range(0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]}


def safe(text: str) -> str:
    """``text`` with its control characters (ESC, BEL, CR, …) as visible ``\\xNN`` escapes."""
    return text.translate(_CONTROLS)


def fold(text: Any, width: int) -> list[tuple[int, Any]]:
    """``text`` (a rich Text) as the terminal rows it takes, each with the offset of its first character
    in ``text``: split at its line breaks, each line cut every ``width`` cells (wide characters count two)."""
    from rich.cells import cell_len

    rows, start = [], 0
    for line in text.split("\n", allow_blank=True):
        plain, cuts, used = line.plain, [], 0
        for i, ch in enumerate(plain):
            w = cell_len(ch)
            if used + w > width and used:
                cuts.append(i)
                used = 0
            used += w
        for k, piece in enumerate(line.divide(cuts) if cuts else [line]):
            rows.append((start + ([0, *cuts][k]), piece))
        start += len(plain) + 1  # and its line break
    return rows


def window(rows: list[Any], room: int, focus: int) -> list[Any]:
    """At most ``room`` of ``rows``, holding row ``focus`` with about a third of the room below it."""
    if len(rows) <= room:
        return rows
    end = min(len(rows), max(room, focus + 1 + room // 3))
    return rows[end - room : end]


class LiveView:
    def __init__(self, *, tokenizer: Any, mask_id: int, console: Any, block_width: int | None = None,
                 title: str = "codila", min_interval: float = 0.1, max_lines: int | None = None,
                 prompt: str = "", prompt_lines: int = 3) -> None:
        self.prompt = [safe(x) for x in prompt.rstrip("\n").split("\n")[-prompt_lines:]] if prompt.strip() else []
        self.tokenizer = tokenizer
        self.mask_id = mask_id
        self.console = console
        self.block_width = block_width
        self.title = title
        self.min_interval = min_interval
        self.max_lines = max_lines  # canvas rows at most; None: whatever the terminal's height leaves
        self._pieces: dict[int, str] = {}
        self._special: set[int] = set()
        self._owner: dict[int, str] = {}
        self._proposed: dict[int, int] = {}
        self._focus = 0  # character offset of the block being written (or the first masked slot) in the text
        self._last: StepEvent | None = None
        self._drawn = 0.0
        self._live = None
        self.redraws = 0

    def __enter__(self) -> LiveView:  # noqa: PYI034 -- subclasses return themselves too
        from rich.live import Live

        self._live = Live(console=self.console, transient=True, redirect_stdout=False, redirect_stderr=False,
                          auto_refresh=False, vertical_overflow="crop")
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
        self._proposed = dict(event.proposed)
        self._last = event
        self._redraw_if_due()

    def _redraw_if_due(self) -> None:
        """Redraw at most once per ``min_interval`` seconds (the view's whole cost)."""
        now = time.perf_counter()
        if self._live is not None and now - self._drawn >= self.min_interval:
            self._drawn = now
            self.redraws += 1
            self._live.update(self.render(), refresh=True)

    def width(self) -> int:
        return max(8, self.console.size.width)

    def room(self, reserved: int = 0) -> int:
        """Canvas rows the terminal has room for under ``reserved`` other rows (the status, the legend)."""
        room = max(1, self.console.size.height - reserved - 1)  # one row spare: the cursor's line
        return min(room, self.max_lines) if self.max_lines else room

    def footer(self, status: Any) -> tuple[list[Any], int]:
        """A blank line, ``status`` and the legend, and the terminal rows they take (they wrap, never cut)."""
        from rich.text import Text

        parts = [Text(""), status, LEGEND()]
        return parts, 1 + len(fold(status, self.width())) + len(fold(parts[2], self.width()))

    def fitted(self, text: Any, *, reserved: int = 0, focus: int | None = None) -> Any:
        """``text`` folded to the terminal's width, cut to :meth:`room` rows around ``focus`` (an offset)."""
        from rich.text import Text

        rows = fold(text, self.width())
        at = focus if focus is not None else self._focus
        row = next((k for k, (start, _) in enumerate(rows) if start > at), len(rows)) - 1
        return Text("\n").join(r for _, r in window(rows, self.room(reserved), max(0, row)))

    def render(self) -> Any:
        from rich.console import Group
        from rich.text import Text

        e = self._last
        if e is None:
            return Text()
        footer, rows = self.footer(self.status(e))
        # the prompt's last lines, dim, above the canvas (issue 63: the prompt was never shown); on a small
        # terminal only its last line, and none where the canvas would get fewer than three rows
        shown = self.prompt if self.room(rows) >= len(self.prompt) + 3 else self.prompt[-1:] if self.room(rows) >= 4 else []
        body = self.fitted(self.tokens_text(e.canvas, self._owner, e.block), reserved=rows + len(shown))
        if not shown:
            return Group(body, *footer)
        return Group(Text("\n".join(shown), style="bright_black", no_wrap=True, overflow="ellipsis"), body, *footer)

    def tokens_text(self, canvas: tuple[int, ...], owner: dict[int, str], block: tuple[int, int] | None,
                    *, block_width: int | None = -1, proposed: dict[int, int] | None = None) -> Any:
        """Styled text of a canvas (the module's looks); records where the block being written starts."""
        from rich.text import Text

        size = self.block_width if block_width == -1 else block_width
        proposed = self._proposed if proposed is None else proposed
        text = Text()
        focus = None
        for i, tok in enumerate(canvas):
            if size and i and i % size == 0:
                text.append("▏", style="bright_black")
            in_block = block is not None and block[0] <= i < block[1]
            if focus is None and (in_block or (block is None and tok == self.mask_id)):
                focus = len(text.plain)
            under = " underline" if in_block else ""
            if tok == self.mask_id:
                guess = self.piece(proposed[i]) if i in proposed else ""
                if guess.strip():
                    text.append(guess.replace("\n", "↵"), style=STYLES["proposed"] + under)
                else:  # nothing proposed, or only blank space: far from the text a DLM proposes line breaks
                    text.append("·", style=STYLES["masked"] + under)  # everywhere (a wall of ↵ read as a bug)
                continue
            style = STYLES.get(owner.get(i, "dlm"), STYLES["dlm"]) + under
            piece = self.piece(tok)
            if tok in self._special:
                style = "bright_black" + under
            if "\n" in piece:
                parts = piece.split("\n")
                for k, part in enumerate(parts):
                    text.append(part, style=style)
                    if k < len(parts) - 1:
                        text.append("↵\n", style="bright_black")
            else:
                text.append(piece, style=style)
        self._focus = focus if focus is not None else len(text.plain)
        return text

    def status(self, e: StepEvent) -> Any:
        from rich.text import Text

        done = sum(1 for s in self._owner.values() if s != "fill")
        rate = f"{done / e.dlm_forwards:.2f}" if e.dlm_forwards else "-"
        speed = done / e.elapsed if e.elapsed > 0 else 0.0
        return Text(f"{self.title}  step {e.step + 1}  DLM forwards {e.dlm_forwards}  AR forwards "
                    f"{e.ar_forwards}  tokens/forward {rate}  {speed:.1f} tok/s", style="bold")


def LEGEND() -> Any:
    """The legend: each sample in its own look, so it reads without colour too."""
    from rich.text import Text

    return Text.assemble(("·", STYLES["masked"]), " masked  ", ("proposed", STYLES["proposed"]), " (DLM)  ",
                         ("committed", STYLES["dlm"]), " (DLM)  ", ("written", STYLES["ar"]), " (AR)  ",
                         ("block", "underline"), "  ", ("∅", "bright_black"), " end")


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
        footer, rows = self.footer(self.status(e).append(f"  middle {len(e.canvas)} slots"))
        before, after = self.before, self.after
        if self.room(rows) < len(before) + len(after) + 3:  # a small terminal: the middle before its context
            keep = max(0, (self.room(rows) - 3) // 2)
            before, after = before[len(before) - keep :] if keep else [], after[:keep]
        middle = self.fitted(self.tokens_text(e.canvas, self._owner, e.block, block_width=None),
                             reserved=rows + len(before) + len(after))
        ctx = lambda lines: Text("\n".join(lines), style="bright_black", no_wrap=True, overflow="ellipsis")
        return Group(ctx(before), middle, ctx(after), *footer)


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
        rate = f"{self._committed / e.dlm_forwards:.2f}" if e.dlm_forwards else "-"
        footer, used = self.footer(Text(f"{self.title}  DLM forwards {e.dlm_forwards}  tokens/forward {rate}  "
                                        f"{self._committed / e.elapsed if e.elapsed > 0 else 0.0:.1f} tok/s",
                                        style="bold"))
        parts: list[Any] = []
        room = self.room(used)
        width = self.width()
        for row in sorted(self._rows):
            canvas, owner = self._rows[row]
            rows = [r for _, r in fold(self.tokens_text(canvas, owner, None, block_width=None, proposed={}), width)]
            limit = max(1, min(room // 2 if row == 0 else self.unit_lines, room - 1))
            if len(rows) > limit:
                rows = rows[:limit] + [Text("…", style="bright_black")]
            left = sum(1 for t in canvas if t == self.mask_id)
            label = "contract" if row == 0 else f"unit {row}"
            if room < len(rows) + 2:  # no room for this row, its label and a last line: say how many are left out
                parts.append(Text(f"… {len(self._rows) - row} more row(s)", style="bright_black"))
                break
            room -= len(rows) + 1
            parts += [Text(f"── {label} ({left} masked) ", style="bold", no_wrap=True), Text("\n").join(rows)]
        return Group(*parts, *footer)


def view_block(cfg: Any) -> int | None:
    """The block grid the live view draws: the width of the blocks ``cfg``'s decoder works in (the knob
    table's ``grid`` knob), none for a decoder without blocks (dream)."""
    from codila_cli.decoding.config import GEN_KNOBS
    from codila_cli.decoding.knobs import block_width

    return block_width(GEN_KNOBS, cfg)
