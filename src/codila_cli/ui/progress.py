"""A Rich progress bar for training on stderr: step of total, the latest log's numbers, and the time left."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def _info(r: dict) -> str:
    parts = [f"loss {r['loss']:.3f}"] if "loss" in r else []
    if "valid" in r:
        parts.append(f"valid {r['valid']:.3f}")
    if "tokens_per_second" in r:
        parts.append(f"{r['tokens_per_second']:.0f} tok/s")
    return "  ".join(parts)


@contextmanager
def step_progress(name: str, total: int, *, disable: bool = False, console: Any = None) -> Iterator[Callable[[dict], None]]:
    """Yields the ``on_log`` callback a trainer calls with ``{"step": N, "loss": …}`` records."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from codila_cli.ui.terminal import stderr_console

    with Progress(TextColumn(f"[bold]{name}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[info]}"), TimeRemainingColumn(), console=console or stderr_console(),
                  disable=disable, transient=False) as bar:
        task = bar.add_task(name, total=total, info="")

        def log(r: dict) -> None:
            bar.update(task, completed=r["step"], info=_info(r))

        yield log
