"""Reading a prompt the way ``codila gen`` and ``codila plan`` take it. Nothing here prints.

The stdin rule (docs/usage.md), so that no script is surprised: stdin is read only when the command is
asked to read it: ``-`` as the prompt, no prompt at all (``echo … | codila gen``), or ``gen --stdin``
(stdin, a blank line, then the argument). A prompt given as an argument never reads stdin by itself, so
``while read -r line; do codila gen "$line"; done < prompts.txt`` runs once per line."""

from __future__ import annotations

import sys
from pathlib import Path

from codila_cli.errors import UsageError
from codila_cli.user_input import LIMITS, read_text

MAX_PROMPT_BYTES = LIMITS["prompt"]  # a prompt larger than this is a mistake (`gen - < /dev/zero`), not a prompt


def _read_stdin() -> str:
    return read_text("-", what="stdin", kind="prompt")


def _read_file(prompt_file: Path) -> str:
    return read_text(prompt_file, what="--prompt-file", kind="prompt")


def read_prompt(prompt: str | None, prompt_file: Path | None, *, with_stdin: bool = False) -> str:
    """The prompt text: ``prompt_file`` if given; ``-`` reads stdin alone; no argument reads a piped
    stdin; ``with_stdin`` (``gen --stdin``) puts stdin before the argument (``cat spec.md | codila gen
    --stdin "write it"``). An argument alone never reads stdin (the module's rule)."""
    stdin_text = None
    if with_stdin and (prompt_file is not None or prompt in (None, "-")):
        raise UsageError("--stdin puts stdin before a prompt argument", hint='codila gen --stdin "write it" < spec.md')
    if with_stdin and sys.stdin.isatty():
        raise UsageError("--stdin reads stdin, and stdin is a terminal", hint='codila gen --stdin "write it" < spec.md')
    piped = prompt is None and prompt_file is None and not sys.stdin.isatty()
    if prompt == "-" or piped or with_stdin:
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
