"""codila's command line: a thin Typer command per module (gen, infill, plan, eval, train, and
models/doctor/config), sharing the option types of ``options`` and the one error boundary of ``app``.

``app`` (the Typer app), ``main`` (the console script) and ``boundary`` are re-exported from
:mod:`codila_cli.cli.app`; the package attribute ``app`` is therefore the Typer app, and the module is
reached by its full name (``from codila_cli.cli.app import guarded``).
"""

from codila_cli.cli.app import app, boundary, main

__all__ = ["app", "boundary", "main"]
