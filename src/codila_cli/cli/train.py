"""``codila train STAGE``: one stage of the bundled models; run it again to resume."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from codila_cli.errors import UsageError


class Stage(str, Enum):
    corpus = "corpus"
    tokenizer = "tokenizer"
    arinit = "arinit"
    dlm = "dlm"
    sft = "sft"
    ar = "ar"
    align = "align"
    tasks = "tasks"
    export = "export"


def train(
    stage: Annotated[Stage, typer.Argument(help="corpus, tokenizer, arinit, dlm, sft, ar, align, tasks, export (in that order).")],
    run_dir: Annotated[Path, typer.Option("--run-dir", help="Where data, checkpoints and logs live.")] = Path("runs/bundled"),
    steps: Annotated[int, typer.Option(help="Optimizer steps for model stages (resumes up to this).")] = 1000,
    data_dir: Annotated[Path | None, typer.Option(envvar="CODILA_DATA", help="Benchmark data for decontamination (shared/data).")] = None,
    init: Annotated[Path | None, typer.Option("--init", help="align: start from this aligned helper directory (re-alignment); sft, tasks: from this Dream checkpoint directory.")] = None,
    shape: Annotated[str, typer.Option("--shape", help="ar: helper shape, base (4.5M) or small (1.9M, session 1).")] = "base",
    frontier: Annotated[float | None, typer.Option("--frontier", help="align, sft: share of left-to-right (frontier) masks, 0..1. [default: 0]")] = None,
    context: Annotated[int | None, typer.Option("--context", help="align: most left-context tokens the helper reads. [default: 48]")] = None,
    batch: Annotated[int | None, typer.Option("--batch", help="model stages: rows per step. [default: the stage's own]")] = None,
    lr: Annotated[float | None, typer.Option("--lr", help="model stages: peak learning rate. [default: the stage's own]")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar; errors only.")] = False,
) -> None:
    """Train one stage of the bundled models; run it again to resume after an interruption.

    Docs: docs/training.md lists the exact commands that produced the shipped weights.
    """
    from codila_cli.train import stages
    from codila_cli.train.options import MODEL_STAGES, check_run_dir, stage_options

    if steps < 1:
        raise UsageError("--steps must be >= 1", hint="e.g. --steps 200")
    if stage == Stage.corpus:
        out = stages.stage_corpus(run_dir, data_dir=data_dir)
    elif stage == Stage.export:
        out = stages.stage_export(run_dir)
    else:
        extra = stage_options(stage.value, shape=shape, init=init, frontier=frontier, context=context, batch=batch,
                              lr=lr) if stage.value in MODEL_STAGES else {}
        check_run_dir(stage.value, run_dir)
        if stage == Stage.tokenizer:
            out = stages.stage_tokenizer(run_dir)
        else:
            from codila_cli.ui.progress import step_progress

            fn = getattr(stages, f"stage_{stage.value}")
            with step_progress(stage.value, steps, disable=quiet) as log:
                out = fn(run_dir, steps=steps, on_log=log, **extra)
    sys.stdout.write(json.dumps(out, default=str) + "\n")
