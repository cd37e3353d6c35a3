"""What llama.cpp's editor clients ask of a fill beyond the text (llama.vscode, llama.vim send both with every
``/infill``): ``t_max_predict_ms``, a time limit after which the fill returns what is committed so far, left
to right: its whole lines, or the part of the first line when none is whole yet (marked truncated; a
diffusion model's committed prefix may hold no line break for a long time, so unlike llama.cpp it does not
wait for one), and ``n_indent``, the least indentation a line after the first may have (the
middle ends before a line indented less: the end of the block being filled). ``id_slot`` is read and ignored: the
only thing that identifies a client is its address, which two editors on one machine (or every user behind
one proxy) share, so a request is cancelled only when its own client goes away (serve/runner.py)."""

from __future__ import annotations

import time
from typing import Any


class OutOfTime(Exception):
    """The fill's time limit passed (raised from a step callback; the decode unwinds as for a cancel)."""


class Deadline:
    """A step callback that passes each event on, keeps the final text so far (serve/requests.py::FinalText)
    and raises OutOfTime at the first step after ``ms`` milliseconds (since it was made); ``text`` is then the
    whole lines of it (all of it when it has no line break), ``seconds`` the time taken."""

    def __init__(self, on_step: Any, tracker: Any, ms: int) -> None:
        self.on_step, self.tracker, self.text, self.seconds = on_step, tracker, "", 0.0
        self.start = time.monotonic()
        self.end = self.start + ms / 1000

    def __call__(self, event: Any) -> None:
        self.on_step(event)
        self.text += self.tracker.new_text(event)
        now = time.monotonic()
        if now > self.end:
            self.seconds = now - self.start
            if "\n" in self.text:
                self.text = self.text[: self.text.rindex("\n") + 1]
            raise OutOfTime


def cut_indent(text: str, n_indent: int | None) -> tuple[str, bool]:
    """``text`` up to the first line after the first whose indentation is under ``n_indent`` columns (blank
    lines do not count); (text, whether it was cut)."""
    if not n_indent or n_indent <= 0:
        return text, False
    lines = text.split("\n")
    for k, line in enumerate(lines[1:], start=1):
        if line.strip() and len(line) - len(line.lstrip(" \t")) < n_indent:
            return "\n".join(lines[:k]) + "\n", True
    return text, False
