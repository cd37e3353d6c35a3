"""``codila eval``: a benchmark for decoder settings; JSONL rows, a Markdown summary and a Pareto plot."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from codila_cli.cli.options import (
    Color,
    ColorOption,
    Device,
    Dtype,
    NoFitCheck,
    Quant,
    Quantize,
    QuantizeAr,
    Quiet,
    Threads,
    Verbose,
    ar_option,
    dlm_option,
    json_option,
)
from codila_cli.errors import UsageError
from codila_cli.eval.settings import EXAMPLES, LENGTH
from codila_cli.report import note_bundled
from codila_cli.ui.terminal import say


def eval_cmd(
    benchmark: Annotated[str, typer.Option("--benchmark", "-b", help="humaneval, mbpp, heldout, dev-ext, heldout-ext, heldout-ext2, heldout-ext3, heldout-ext4, heldout-ext5, dev-ext-bare, heldout-ext-bare, heldout-ext2-bare, heldout-ext3-bare, heldout-ext4-bare, heldout-ext5-bare (the same functions cut to their signature), everyday, he-infill-single, he-infill-multi, or a JSONL file of your own tasks (HumanEval's schema; docs/evaluation.md).", rich_help_panel="Input")] = "heldout",
    output: Annotated[Path, typer.Option("--output", "-o", help="Directory for rows.jsonl, summary.md/json, pareto.png (and paired.json).", rich_help_panel="Output")] = Path("codila-eval"),
    settings: Annotated[list[str] | None, typer.Option("--setting", help=f"Decoder setting, repeatable: {', '.join(EXAMPLES)}. Keys: docs/settings.md. [default: what codila gen runs: the helper's recommendation spelled out in these keys, the label the summary shows]", rich_help_panel="Decoding")] = None,
    sweep: Annotated[bool, typer.Option(help="The paper's grid: dream K=1,2,4,8; threshold; codila B=2,4,8; codila B=4 with τ.", rich_help_panel="Decoding")] = False,
    limit: Annotated[int | None, typer.Option(help="First N tasks only.", rich_help_panel="Input")] = None,
    tasks: Annotated[list[str] | None, typer.Option("--task", help="Task id, repeatable.", rich_help_panel="Input")] = None,
    data_dir: Annotated[Path | None, typer.Option(envvar="CODILA_DATA", help="Benchmark data directory (mbpp/, human-eval-infilling/).", rich_help_panel="Input")] = None,
    dlm: dlm_option("Diffusion model: alias, repo id or directory. [default: bundled-dlm; bundled-infill for he-infill-*]") = None,
    ar: ar_option("AR helper for codila settings. [default: bundled-ar with the bundled DLM]") = None,
    max_new_tokens: Annotated[int | None, typer.Option(help=f"Canvas length per task; for he-infill-* the longest middle. [default: {LENGTH[False]}; {LENGTH[True]} for he-infill-*, DreamOn's setting]", rich_help_panel="Decoding")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds per test program in the sandbox.", rich_help_panel="Sandbox")] = 10.0,
    compile_model: Annotated[bool, typer.Option("--compile", help="torch.compile the model forwards.", rich_help_panel="Runtime")] = False,
    seed: Annotated[int, typer.Option(help="Random seed for every task (decoding is greedy unless a setting samples).", min=0, max=2**63 - 1, rich_help_panel="Decoding")] = 0,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Completion tasks decoded together per DLM forward (1–64).", rich_help_panel="Decoding")] = 1,
    no_stop: Annotated[bool, typer.Option("--no-stop", help="Keep the whole completion: no stop lines (by default a completion ends before its next top-level line, as in the Codex paper's HumanEval protocol).", rich_help_panel="Decoding")] = False,
    unsafe_local_exec: Annotated[bool, typer.Option("--unsafe-local-exec", help="Run generated code even where no jail (bubblewrap) is available: only in a throw-away machine.", rich_help_panel="Sandbox")] = False,
    device: Device = "auto",
    dtype: Dtype = "auto",
    threads: Threads = 0,
    no_fit_check: NoFitCheck = False,
    quantize: Quantize = Quant.none,
    quantize_ar: QuantizeAr = Quant.none,
    json_out: json_option("Print the summary as one JSON object (the rows stay in rows.jsonl) instead of Markdown.") = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
    color: ColorOption = Color.auto,
) -> None:
    """Run a benchmark for decoder settings; write JSONL rows, a Markdown summary and a Pareto plot.

    Generated code runs only here, in a sandboxed subprocess (docs/evaluation.md).
    """
    from codila_cli.engine import Engine, generate as engine_gen  # noqa: I001
    from codila_cli.eval.benchmarks import load_tasks, select
    from codila_cli.eval.distributed import device_for, finish, gather_rows, init_from_env
    from codila_cli.eval.runner import row_outcome, run_eval, write_outputs
    from codila_cli.provenance import provenance
    from codila_cli.eval.sandbox import SandboxLimits
    from codila_cli.eval.session import (PartialRows, choose_settings, is_infill, need_extras, need_jail,
                                         prepare_output, run_warnings)
    from codila_cli.ui.progress import item_progress
    from codila_cli.ui.terminal import stderr_console

    if not 1 <= batch_size <= 64:
        raise UsageError(f"--batch-size must be between 1 and 64, got {batch_size}", hint="use e.g. --batch-size 8")
    need_extras()
    if max_new_tokens is None:
        max_new_tokens = LENGTH[is_infill(benchmark)]
    run = choose_settings(benchmark=benchmark, labels=settings or [], sweep=sweep, dlm=dlm, ar=ar,
                          max_new_tokens=max_new_tokens)
    chosen = select(load_tasks(benchmark, data=data_dir, stop=not no_stop), limit=limit, ids=tasks)
    prepare_output(output)
    limits = SandboxLimits(timeout=_timeout(timeout), cpu_seconds=max(1, int(min(timeout, 86400))),
                           unsafe_local_exec=unsafe_local_exec)
    if any(t.test for t in chosen):
        need_jail(unsafe_local_exec, quiet=quiet, limits=limits)
    shard = init_from_env()
    models = Engine.load(dlm=run.dlm, ar=run.ar, device=device_for(shard, device), dtype=dtype, compile=compile_model,
                         threads=threads, quantize=quantize.value, quantize_ar=quantize_ar.value).models
    talk = not quiet and shard.main
    note_bundled(models, quiet=not talk, command="infill" if is_infill(benchmark) else "eval")
    for warning in run_warnings(models, chosen, run.settings, max_new_tokens=max_new_tokens) if talk else ():
        say(f"Warning: {warning}\n")
    if batch_size > 1 and not engine_gen.batching_pays(models) and talk:
        say(f"Warning: --batch-size {batch_size} on the CPU: a batch runs slower there "
                         "than one task at a time (same completions; docs/decoders.md, \"Batching\")\n")
    total = -(-len(chosen) // shard.world) * len(run.settings)
    partial = PartialRows(output, shard.rank)  # survives an interrupted run
    try:
        with item_progress("eval", total, quiet=not talk, console=stderr_console(color.value)) as done:
            def log(row: dict) -> None:
                partial.write(row)
                done(f"{row['task_id']} {row['setting']}: {row_outcome(row)}")

            mine = run_eval(models, chosen, run.settings, seed=seed, limits=limits, on_row=log, rank=shard.rank,
                            world=shard.world, batch_size=batch_size)
    except KeyboardInterrupt:  # the finished rows become the results, marked as interrupted
        partial.close()
        if shard.world == 1 and partial.rows:
            write_outputs(output, partial.rows, title=f"{benchmark} (interrupted after {len(partial.rows)} rows)",
                          provenance=provenance(models))
        raise
    partial.close()
    rows = gather_rows(shard, mine)
    finish()
    if rows is None:  # not rank 0: rank 0 writes everything
        partial.discard()
        return
    summary = write_outputs(output, rows, title=f"{benchmark} ({len(chosen)} tasks)", provenance=provenance(models))
    partial.discard()  # only once the results are safely written
    _done(summary, rows, output, json_out=json_out, verbose=verbose)


def _done(summary: list[dict], rows: list[dict], output: Any, *, json_out: bool, verbose: bool) -> None:
    """The summary on stdout (Markdown, or with --json one object); with -v, where the files went and
    what made the numbers (provenance.json) on stderr."""
    import json

    from codila_cli.eval.runner import markdown, paired_quality, paired_section

    paired = paired_quality(rows)
    if json_out:
        made = json.loads((output / "provenance.json").read_text(encoding="utf-8"))
        sys.stdout.write(json.dumps({"schema_version": 1, "command": "eval", "output": str(output), "summary": summary,
                                     "paired": paired, "provenance": made}) + "\n")
    else:
        sys.stdout.write(markdown(summary) + paired_section(paired))
    if verbose:
        from codila_cli.provenance import provenance_line

        made = json.loads((output / "provenance.json").read_text(encoding="utf-8"))
        say(f"rows, summary and plot in {output}\n{provenance_line(made)}\n")


def _timeout(seconds: float) -> float:
    """--timeout: a finite number of seconds above 0 (nan and inf would reach the sandbox's limits)."""
    import math

    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(f"--timeout must be a number of seconds above 0, got {seconds}", hint="e.g. --timeout 10")
    return seconds
