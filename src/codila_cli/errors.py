"""Exceptions raised by the codila library, each carrying its CLI exit code and an optional hint.

The CLI has exactly one error boundary (``cli._boundary``) that turns these into an ``Error:`` line,
an optional ``Hint:`` line on stderr and the exit code below. Library code never prints.

Exit codes (docs/exit-codes.md): 0 ok · 1 runtime error · 2 usage error · 3 model not available
locally · 4 output failed ``--strict`` syntax check · 130 interrupted.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_MODEL_MISSING = 3
EXIT_SYNTAX = 4
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: stdout's reader closed the pipe (what `yes | head` reports for yes)


class CodilaError(Exception):
    """Base class: a failure the user can understand and act on."""

    exit_code: int = EXIT_RUNTIME

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(CodilaError):
    """Bad input from the user (flags, prompt, file): exit 2."""

    exit_code = EXIT_USAGE


class ModelNotFoundError(CodilaError):
    """The model is not in the local Hugging Face cache (and codila never downloads): exit 3."""

    exit_code = EXIT_MODEL_MISSING


class ModelLoadError(CodilaError):
    """The checkpoint exists but cannot be used safely (pickle weights, damaged file, no mask token)."""

    exit_code = EXIT_RUNTIME


class IncompatibleModelsError(CodilaError):
    """The DLM and the AR helper do not share a vocabulary, so CoDiLA cannot bridge them."""

    exit_code = EXIT_RUNTIME


class PortInUseError(CodilaError):
    """``codila serve``'s address is taken by another process: exit 1, before any model loads."""

    exit_code = EXIT_RUNTIME


class StrictSyntaxError(CodilaError):
    """``--strict`` was given and the result does not parse: exit 4."""

    exit_code = EXIT_SYNTAX
