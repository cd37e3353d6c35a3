"""Stop lines: the output ends before the first generated line that starts with a given prefix.

This is how completion models are evaluated on HumanEval (Chen et al. 2021, "Evaluating Large Language
Models Trained on Code", §2.3: sampling stops at ``\\nclass``, ``\\ndef``, ``\\n#``, ``\\nif``, ``\\nprint``),
written as line prefixes: ``"def "`` here is the stop sequence ``"\\ndef "``. A line counts when it
starts inside the completion; the completion's first line counts only when the prompt ends a line.

A diffusion decoder commits tokens out of order, but never remasks one, so the longest fully committed
prefix of the canvas is final: once a stop line appears in it, the rest of the canvas cannot change the
output and decoding ends there (decoding/base.py::Canvas.done), as it does at an end-of-text token.
"""

from __future__ import annotations

from typing import Any

HUMANEVAL = ("def ", "class ", "if ", "print(", "#", "@")  # a function body ends at the next top-level line
MBPP = ("class ", "assert ", '"""', "print(", "if ")  # a program from scratch: helper defs may follow


def stop_offset(completion: str, prefixes: tuple[str, ...], *, at_line_start: bool) -> int | None:
    """Offset in ``completion`` where the first line starting with one of ``prefixes`` begins, else None.
    ``completion[:offset]`` ends with the newline of the line before (or is empty)."""
    if not prefixes:
        return None
    pos = 0 if at_line_start else completion.find("\n") + 1
    while pos > 0 or (pos == 0 and at_line_start):
        if completion.startswith(prefixes, pos):
            return pos
        nxt = completion.find("\n", pos)
        if nxt < 0:
            return None
        pos, at_line_start = nxt + 1, False
    return None


def ends_line(tokenizer: Any, prompt_ids: list[int]) -> bool:
    """Whether the prompt's text ends a line (so the completion's first line is a whole line)."""
    if not prompt_ids:
        return True
    return tokenizer.decode(prompt_ids[-1:], skip_special_tokens=False).endswith("\n")
