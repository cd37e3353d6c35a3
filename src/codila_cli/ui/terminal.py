"""The terminal side of every command: the stderr console, whether stderr is a terminal (the live
views need one), and keeping the libraries' own progress bars and warnings off stderr."""

from __future__ import annotations

import os
import sys
from typing import Any

COLORS = ("auto", "always", "never")


def stderr_console(color: str = "auto") -> Any:
    """A Rich console on stderr; ``always`` forces colour, ``never`` turns it off, ``auto`` asks the terminal."""
    from rich.console import Console

    force = {"always": True, "never": False}.get(color)
    # on a terminal its own size decides (and follows a resize): an exported COLUMNS or LINES, often stale
    # (a harness's 80 in a 60-column pane), made Rich wrap lines the terminal then broke mid-word (issue 63)
    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} if stderr_is_tty() else None
    return Console(stderr=True, highlight=False, force_terminal=force, no_color=color == "never" or None,
                   _environ=environ)


def terminal_width(default: int = 80) -> int:
    """The columns of the terminal on stderr (its own size, not COLUMNS); ``default`` off a terminal."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return default


def stderr_is_tty() -> bool:
    """The live view needs a real terminal on stderr (``--color always`` colours, it does not animate)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def quiet_libraries(verbose: bool = False) -> None:
    """Hugging Face / transformers progress bars and warnings stay off unless -v (set before their import)."""
    if not verbose:
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def printable(text: str, *, keep: str = "") -> str:
    """``text`` safe to write to a terminal: control characters (escape sequences, carriage returns,
    bells) from task ids, paths or model names are shown escaped (``\\x1b``), never sent raw; ``keep``
    names the ones allowed through (a message's own line breaks)."""
    return "".join(c if c.isprintable() or c == " " or c in keep else repr(c)[1:-1] for c in str(text))


def say(text: str) -> None:
    """Write ``text`` to stderr with its control characters escaped (its own line breaks kept): every
    line codila writes there may hold a task id, a path, a model name or model output."""
    sys.stderr.write(printable(text, keep="\n"))
