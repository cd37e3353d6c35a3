"""A Rich progress bar for training on stderr: step of total, the latest log's numbers, and the time left."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from codila_cli.ui.terminal import say


def _info(r: dict) -> str:
    parts = [f"loss {r['loss']:.3f}"] if "loss" in r else []
    if "valid" in r:
        parts.append(f"valid {r['valid']:.3f}")
    if "tokens_per_second" in r:
        parts.append(f"{r['tokens_per_second']:.0f} tok/s")
    return "  ".join(parts)


@contextmanager
def step_progress(name: str, total: int, *, disable: bool = False, console: Any = None,
                  quiet: bool | None = None) -> Iterator[Callable[[dict], None]]:
    """Yields the ``on_log`` callback a trainer calls with ``{"step": N, "loss": …}`` records: a Rich bar
    on a terminal; with ``quiet`` given, one plain line per record on any other stderr (nothing when
    quiet); ``disable`` (the older form) turns the bar off and prints nothing."""
    import sys

    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from codila_cli.ui.terminal import stderr_console, stderr_is_tty

    if quiet is not None:
        if quiet:
            yield lambda r: None
            return
        if not stderr_is_tty():
            def line(r: dict) -> None:
                say(f"{name} step {r['step']}/{total}  {_info(r)}\n")
                sys.stderr.flush()

            yield line
            return

    with Progress(TextColumn(f"[bold]{name}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[info]}"), TimeRemainingColumn(), console=console or stderr_console(),
                  disable=disable, transient=False) as bar:
        task = bar.add_task(name, total=total, info="")

        def log(r: dict) -> None:
            bar.update(task, completed=r["step"], info=_info(r))

        yield log


@contextmanager
def item_progress(name: str, total: int, *, quiet: bool = False, console: Any = None,
                  tty: bool | None = None) -> Iterator[Callable[[str], None]]:
    """Progress over ``total`` items (eval rows, gen samples), yielding ``done(label)`` to call as each
    finishes: on a terminal a Rich bar with the count and the time left; on any other stderr one plain
    line per item (``name 3/8 label  12.4 s, about 20 s left``), so a piped or logged run is not silent;
    nothing with ``quiet``."""
    import sys
    import time

    from codila_cli.ui.terminal import printable, stderr_is_tty

    if quiet:
        yield lambda label: None
        return
    if tty if tty is not None else stderr_is_tty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        from codila_cli.ui.terminal import stderr_console

        with Progress(TextColumn(f"[bold]{name}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                      TimeRemainingColumn(), console=console or stderr_console(), transient=False) as bar:
            task = bar.add_task(name, total=total, info="")
            yield lambda label: bar.update(task, advance=1, info=printable(label))
        return
    t0, count = time.perf_counter(), 0

    def done(label: str) -> None:
        nonlocal count
        count += 1
        spent = time.perf_counter() - t0
        left = spent / count * (total - count)
        say(f"{name} {count}/{total} {printable(label)}  {spent:.1f} s" + (f", about {left:.0f} s left" if count < total else "")
                         + "\n")
        sys.stderr.flush()

    yield done
