"""What llama.cpp's editor clients ask of a fill beyond the text (llama.vscode, llama.vim send both with every
``/infill``): ``t_max_predict_ms``, a time limit after which the fill returns what is committed so far, left
to right: its whole lines, or the part of the first line when none is whole yet (marked truncated; a
diffusion model's committed prefix may hold no line break for a long time, so unlike llama.cpp it does not
wait for one), and ``n_indent``, the least indentation a line after the first may have (the
middle ends before a line indented less: the end of the block being filled); and ``id_slot``: a newer fill
in a client's slot cancels the earlier one (serve/stream.py::run_job)."""

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


def claim_slot(st: Any, job: Any) -> int | None:
    """A fill that names its slot (llama.cpp's ``id_slot``, which llama.vscode and llama.vim send) cancels
    the same client's earlier fill in that slot, running or waiting: the editor moved on. Its number."""
    if job.slot is None:
        return None
    mine = st.slot_seq[job.slot] = st.slot_seq.get(job.slot, 0) + 1
    earlier = st.slots.get(job.slot)
    if earlier is not None:
        earlier.cancel("superseded")
        st.metrics.cancelled.labels("superseded").inc()
    return mine


def superseded() -> dict:
    """llama.cpp's answer shape for a fill a newer one in its slot replaced: empty, nothing decoded."""
    return {"content": "", "stop": True, "stop_type": "none", "truncated": False, "tokens_predicted": 0,
            "codila": {"cancelled": "superseded"}}
