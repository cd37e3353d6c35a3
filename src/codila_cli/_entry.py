"""The `codila` console script: a Ctrl-C while the CLI is still being imported (a second or more on a
loaded machine) ends the run as a later one does, with "Interrupted." and exit 130, not a traceback
(issue 53). The CLI's own handling (cli/app.py::main) takes over once it is imported."""

from __future__ import annotations

import os
import signal
import sys

from codila_cli.errors import EXIT_INTERRUPTED  # a light module: nothing heavy runs before the guard


def _early(signum: int, frame: object) -> None:
    try:
        sys.stderr.write("Interrupted.\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_INTERRUPTED)


def guard() -> None:
    """Until :func:`main` hands over, SIGINT ends the process quietly with 130."""
    signal.signal(signal.SIGINT, _early)


def main() -> None:
    # an inherited ignored SIGINT (a script's background job: `codila gen … &`) stays ignored, as Python
    # itself leaves it: a Ctrl-C meant for the foreground job must not stop this one
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if not ignored:
        guard()
    from codila_cli.cli.app import main as cli_main

    if not ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # from here a Ctrl-C is a KeyboardInterrupt again
    cli_main()
