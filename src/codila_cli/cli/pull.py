"""``codila pull``: fetch checkpoints into the Hugging Face cache (models/pull.py does the work). Progress
goes to stderr (a Rich bar on a terminal, one line per file otherwise); stdout stays empty, or holds one
JSON document with ``--json``."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any

import typer

from codila_cli.cli.options import json_option
from codila_cli.ui.terminal import say


def pull(
    names: Annotated[list[str], typer.Argument(metavar="NAME...", help="Aliases (`codila models`) or ORG/NAME[@REVISION] repository ids: DLMs and AR helpers alike.", show_default=False)],
    json_out: json_option("One JSON object: each model's repository, commit, snapshot directory and bytes.") = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress; errors only.")] = False,
) -> None:
    """Download models into the Hugging Face cache: only the files codila loads (config, tokenizer,
    safetensors), each checked against the hub's checksum, config.json last, so an interrupted pull
    never leaves a snapshot that looks complete; run it again to resume. HF_TOKEN is used for gated or
    private repositories; HF_ENDPOINT names another hub.

    Examples:

        codila pull sdar-1.7b

        codila pull dream-coder qwen3-0.6b

        codila pull JetLM/SDAR-8B-Chat@main
    """
    from codila_cli.models.cache import hf_cache_dir
    from codila_cli.models.pull import plan
    from codila_cli.models.pull import pull as fetch

    token = os.environ.get("HF_TOKEN") or None
    specs = [_spec(n) for n in names]  # every name checked before the first request
    done = []
    for spec in specs:
        p = plan(spec, cache_dir=hf_cache_dir(), token=token)
        if not quiet:
            pinned = "pinned" if spec.revision and spec.revision == p.commit else (spec.revision or "main")
            say(f"pull {spec.name}: {spec.repo_id} @ {p.commit} ({pinned}), {len(p.files)} files, "
                f"{p.total_bytes / 2**20:.1f} MiB\n")
        with _Progress(quiet=quiet, total=p.total_bytes) as show:
            path = fetch(p, token=token, on_event=show)
        done.append({"name": spec.name, "repo_id": spec.repo_id, "commit": p.commit, "path": str(path),
                     "bytes": p.total_bytes, "files": [f.name for f in p.files]})
        if not quiet:
            say(f"pulled {spec.name} ({spec.repo_id} @ {p.commit}) into {path}\n")
    if json_out:
        sys.stdout.write(json.dumps({"schema_version": 1, "command": "pull", "models": done}) + "\n")


def _spec(name: str) -> Any:
    from codila_cli.errors import UsageError
    from codila_cli.models.registry import resolve_spec

    spec = resolve_spec(name, kind="dlm")
    if spec.repo_id is None:
        raise UsageError(f"'{name}' is not on the hub (a bundled model or a local directory)",
                         hint="pull an alias from `codila models` or an ORG/NAME repository id")
    return spec


class _Progress:
    """PullEvents drawn on stderr: a Rich bar (bytes, rate, time left) on a terminal, else a line per file."""

    def __init__(self, *, quiet: bool, total: int) -> None:
        from codila_cli.ui.terminal import stderr_is_tty

        self.quiet, self.total, self.rich, self.bar, self.task = quiet, total, stderr_is_tty() and not quiet, None, None

    def __enter__(self) -> Any:
        if self.rich:
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            from codila_cli.ui.terminal import stderr_console

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                                TimeRemainingColumn(), console=stderr_console(), transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task("pull", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def __call__(self, event: Any) -> None:
        if self.quiet:
            return
        if self.bar is not None:
            if event.kind == "bytes":
                self.bar.advance(self.task, event.done)
            elif event.kind == "cached":
                self.bar.advance(self.task, event.size)
            elif event.kind == "file":
                self.bar.update(self.task, description=event.file)
            return
        if event.kind == "verified":
            say(f"  {event.file} ({event.size / 2**20:.1f} MiB) verified\n")
        elif event.kind == "cached":
            say(f"  {event.file} already in the cache\n")
