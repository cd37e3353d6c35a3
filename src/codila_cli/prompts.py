"""Reading a prompt the way ``codila gen`` and ``codila plan`` take it. Nothing here prints.

The stdin rule (docs/usage.md), as llm and ollama have it, so that no piped text is silently dropped:

* ``-`` as the prompt, or no prompt with stdin piped (``echo "def f():" | codila gen``): stdin is the prompt.
* A prompt (argument or ``--prompt-file``) with text piped or redirected into stdin (``cat spec.md |
  codila gen "def total(xs):"``): stdin is **context before the prompt** (stdin, a blank line, the
  prompt), and stdout repeats only the prompt and what the model wrote, never the piped context.
* ``--stdin`` asks for that join explicitly and waits for stdin however long it takes; without it, a
  pipe that stays open and silent for :data:`STDIN_GRACE_S` (an agent's or a CI runner's inherited
  stdin) is left unread, and the caller warns.
* stdin that is a terminal, ``/dev/null`` or another device is never read with a prompt given. In a
  ``while read -r line; do codila gen "$line"; done < prompts.txt`` loop, give ``< /dev/null`` to each run.
"""

from __future__ import annotations

import io
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from codila_cli.errors import UsageError
from codila_cli.user_input import LIMITS, decode, read_text

MAX_PROMPT_BYTES = LIMITS["prompt"]  # a prompt larger than this is a mistake (`gen - < /dev/zero`), not a prompt


STDIN_GRACE_S = 1.0  # how long a prompt argument waits for a piped stdin to show data or end


def silent_stdin_warning(*, wait_flag: bool, sent: int = 0) -> str:
    """The warning for an open stdin left unused (``wait_flag``: the command has ``--stdin``; ``sent``: bytes
    it sent before it went silent without ending)."""
    wait = "give --stdin to wait for it, " if wait_flag else ""
    if sent:
        return (f"Warning: stdin sent {sent} bytes, then stayed open and silent for {STDIN_GRACE_S:g} s without "
                f"ending; it was not used (close the pipe, {wait}or < /dev/null)\n")
    return f"Warning: stdin is an open pipe with nothing on it; it was not read (pipe text in, {wait}or < /dev/null)\n"


@dataclass(frozen=True)
class Prompt:
    """The prompt text the model reads, and how many of its first characters are piped context (stdin
    before a prompt) that stdout must not repeat; ``silent_stdin``: a pipe was open but silent, not read."""

    text: str
    context: int = 0
    silent_stdin: bool = False
    stdin_sent: int = 0  # bytes a pipe sent before it went silent without ending (then not used)


def _read_stdin() -> str:
    return read_text("-", what="stdin", kind="prompt")


def _read_file(prompt_file: Path) -> str:
    return read_text(prompt_file, what="--prompt-file", kind="prompt")


def _stdin_kind() -> str:
    """"tty", "device" (``/dev/null`` and the like: never read beside a prompt), "pipe" (a pipe, socket
    or regular file), or "memory" (a stream without a descriptor, as in tests)."""
    if sys.stdin is None:
        return "device"
    if sys.stdin.isatty():
        return "tty"
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return "memory"
    return "pipe" if stat.S_ISFIFO(mode) or stat.S_ISREG(mode) or stat.S_ISSOCK(mode) else "device"


def _read_while_talking(grace: float) -> tuple[bytes, bool]:
    """stdin's bytes up to its end, as long as it is never silent for ``grace`` seconds: (bytes read,
    whether it ended). A pipe that sends text and then stays open is not waited on for ever (issue 60)."""
    import select

    fd, chunks, size = sys.stdin.fileno(), [], 0
    while True:
        try:
            ready = select.select([fd], [], [], grace)[0]
        except (OSError, ValueError):
            ready = [fd]
        if not ready:
            return b"".join(chunks), False
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks), True
        size += len(chunk)
        if size > MAX_PROMPT_BYTES:
            raise UsageError(f"stdin is over the {MAX_PROMPT_BYTES // 2**20} MiB limit for a prompt",
                             hint="no model's context holds a prompt this large; pipe less")
        chunks.append(chunk)


def read_prompt_parts(prompt: str | None, prompt_file: Path | None, *, with_stdin: bool = False) -> Prompt:
    """The prompt by the module's rule: ``prompt_file`` or the argument, with piped stdin as context
    before it; ``-`` or no argument: stdin alone. ``with_stdin`` (``gen --stdin``) insists on the join."""
    if with_stdin and (prompt_file is None and prompt in (None, "-")):
        raise UsageError("--stdin puts stdin before a prompt argument", hint='codila gen --stdin "write it" < spec.md')
    if prompt_file is not None and prompt not in (None, "-"):
        raise UsageError("give the prompt as an argument or with --prompt-file, not both", hint="drop one of them")
    kind = _stdin_kind()
    if with_stdin and kind == "tty":
        raise UsageError("--stdin reads stdin, and stdin is a terminal", hint='codila gen --stdin "write it" < spec.md')
    if prompt == "-" and prompt_file is None:
        return Prompt(_read_stdin())
    if prompt is None and prompt_file is None:
        if kind == "tty":
            raise UsageError("no prompt given", hint='codila gen "def fib(n):"   or   echo "…" | codila gen')
        return Prompt(_read_stdin())
    given = _read_file(prompt_file) if prompt_file is not None else str(prompt)
    if kind in ("tty", "device"):
        return Prompt(given)
    if not with_stdin and kind == "pipe":
        raw, ended = _read_while_talking(STDIN_GRACE_S)
        if not ended:  # silent for the grace period, before sending anything or after sending some
            return Prompt(given, silent_stdin=True, stdin_sent=len(raw))
        piped = decode(raw, where="stdin")
    else:
        piped = _read_stdin()
    if not piped.strip():
        return Prompt(given)
    context = piped.rstrip("\n") + "\n\n"
    return Prompt(context + given, context=len(context))


def read_prompt(prompt: str | None, prompt_file: Path | None, *, with_stdin: bool = False) -> str:
    """The prompt text of :func:`read_prompt_parts`."""
    return read_prompt_parts(prompt, prompt_file, with_stdin=with_stdin).text
