"""Reading a prompt the way ``codila gen`` and ``codila plan`` take it: an argument, ``-`` (stdin only),
``--prompt-file FILE``, or piped stdin placed before the argument. Nothing here prints."""

from __future__ import annotations

import sys
from pathlib import Path

from codila_cli.errors import UsageError


def stdin_ready(timeout: float = 0.2) -> bool:
    """True when stdin has data (or EOF) within ``timeout`` seconds; True where select() cannot tell."""
    try:
        import select

        return bool(select.select([sys.stdin], [], [], timeout)[0])
    except (OSError, ValueError, TypeError, AttributeError):  # not a real file (tests) or not selectable
        return True


def _read_stdin() -> str:
    raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"stdin is not valid UTF-8 (byte {exc.start})", hint="pipe UTF-8 text") from None


def _read_file(prompt_file: Path) -> str:
    try:
        return prompt_file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{prompt_file} is not UTF-8 text", hint="save the prompt file as UTF-8") from None
    except OSError as exc:
        raise UsageError(f"cannot read {prompt_file}: {exc.strerror or exc}",
                         hint="check the path and its permissions") from None


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    """The prompt text: ``prompt_file`` if given, ``-`` reads stdin alone, and text piped on stdin goes
    before an argument (``cat spec.md | codila gen "write it"``). An open stdin that sends nothing (agents,
    CI) never blocks a prompt given as an argument."""
    stdin_text = None
    piped = not sys.stdin.isatty() and prompt_file is None
    if piped and prompt not in (None, "-") and not stdin_ready():
        piped = False
    if prompt == "-" or piped:
        stdin_text = _read_stdin()
    if prompt_file is not None:
        if prompt not in (None, "-") and prompt_file:
            raise UsageError("give the prompt as an argument or with --prompt-file, not both",
                             hint="drop one of them")
        return _read_file(prompt_file)
    if prompt == "-":
        return stdin_text or ""
    if stdin_text:
        return stdin_text.rstrip("\n") + ("\n\n" + prompt if prompt else "\n")
    if prompt is None:
        raise UsageError("no prompt given", hint='codila gen "def fib(n):"   or   echo "…" | codila gen')
    return prompt
