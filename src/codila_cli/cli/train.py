"""``codila train``: ``align`` makes the CoDiLA helper for any model pair; the other commands build the
bundled models stage by stage (run one again to resume it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from codila_cli.cli.options import Device, Quiet, json_option
from codila_cli.errors import CodilaError, UsageError
from codila_cli.ui.terminal import say

STAGE_HELP = {
    "corpus": "Build the decontaminated corpus of the bundled models.",
    "tokenizer": "Train the bundled BPE tokenizer and tokenise the corpus.",
    "arinit": "Causal-LM pretraining of the bundled DLM's network (Dream's AR initialisation).",
    "dlm": "Masked-diffusion training of the bundled DLM from the arinit weights.",
    "sft": "Prompt-conditioned diffusion (Dream's SFT recipe) on the bundled DLM.",
    "ar": "Causal-LM pretraining of the bundled AR helper.",
    "tasks": "The bundled infill/plan fine-tune (DreamOn and SDDC examples).",
    "export": "Copy the finished bundled models into the package.",
}
RunDir = Annotated[Path, typer.Option("--run-dir", help="Where data, checkpoints and logs live.")]
JsonOut = json_option("Print the result as one JSON object on stdout instead of one line of text.")


def _result(name: str, out: dict, *, as_json: bool) -> None:
    """stdout: one JSON object with --json, else one line (``align: output ./h, step 1000, loss 1.92``)."""
    if as_json:
        sys.stdout.write(json.dumps(out, default=str) + "\n")
        return
    shown = [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in out.items()
             if isinstance(v, (str, int, float, Path)) and not isinstance(v, bool)]
    sys.stdout.write(f"{name}: {', '.join(shown)}\n")
Steps = Annotated[int, typer.Option(help="Optimizer steps for model stages (resumes up to this).")]


def align(
    dlm: Annotated[str, typer.Option("--dlm", "-m", help="The frozen diffusion model: alias, repo id, directory or bundled-dlm (resolved like codila gen).")],
    ar: Annotated[str, typer.Option("--ar", help="The helper to align: alias, repo id, directory or bundled-ar (an aligned helper re-aligns it).")],
    data: Annotated[str, typer.Option("--data", help="Training text: a directory of source files, a .jsonl/.parquet file, a datasets directory (save_to_disk) or bundled:RUN_DIR.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="The helper directory to write (training state goes in its training/).")],
    block_sizes: Annotated[str, typer.Option("--block-sizes", help="Block sizes B, one drawn per step.")] = "2,4,8",
    steps: Annotated[int, typer.Option(help="Optimizer steps (with --resume: continue up to this).")] = 1000,
    batch: Annotated[int, typer.Option(help="Rows per optimizer step, over all processes and micro-batches.")] = 8,
    grad_accum: Annotated[int, typer.Option("--grad-accum", help="Micro-batches per step (each process).")] = 1,
    lr: Annotated[float, typer.Option(help="Peak learning rate (AdamW, linear warm-up, cosine decay).")] = 1e-4,
    warmup: Annotated[int, typer.Option(help="Warm-up steps.")] = 100,
    weight_decay: Annotated[float, typer.Option("--weight-decay", help="AdamW weight decay (matrices only).")] = 0.1,
    grad_clip: Annotated[float, typer.Option("--grad-clip", help="Gradient norm clip.")] = 1.0,
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per training window.")] = 1024,
    blocks_per_row: Annotated[int, typer.Option("--blocks-per-row", help="Blocks scored per window.")] = 8,
    context: Annotated[int, typer.Option(help="Most committed left-context tokens the helper reads (0 = none; what gen's --ar-context feeds).")] = 0,
    context_share: Annotated[float, typer.Option("--context-share", help="Share of blocks that get their left context (frontier blocks always do).")] = 0.5,
    frontier: Annotated[float, typer.Option(help="Share of steps with left-to-right (frontier) masks, 0..1.")] = 0.0,
    weighting: Annotated[str, typer.Option(help="nelbo (the paper's Eq. 2, 1/t per masked token) or mean (plain block CE).")] = "nelbo",
    field: Annotated[str, typer.Option(help="The text field of a .jsonl/.parquet/datasets source.")] = "text",
    glob: Annotated[str, typer.Option(help="Files of a directory source.")] = "**/*.py",
    valid_fraction: Annotated[float, typer.Option("--valid-fraction", help="Share of documents held out (by hash) for validation.")] = 0.02,
    valid_every: Annotated[int, typer.Option("--valid-every", help="Validation loss every N steps.")] = 200,
    valid_rows: Annotated[int, typer.Option("--valid-rows", help="Held-out windows in each validation.")] = 16,
    ckpt_every: Annotated[int, typer.Option("--ckpt-every", help="Checkpoint every N steps (and on Ctrl-C / SIGTERM).")] = 200,
    select_decoding: Annotated[int, typer.Option("--select-decoding", help="Held-out function prompts for choosing the recorded codila_decoding (0 = skip).")] = 24,
    optimizer: Annotated[str, typer.Option(help="adamw, or adamw8bit (bitsandbytes, CUDA).")] = "adamw",
    grad_checkpointing: Annotated[bool | None, typer.Option("--grad-checkpointing/--no-grad-checkpointing", help="Recompute the helper's activations in backward. [default: on with CUDA]", show_default=False)] = None,
    marginals_cache: Annotated[Path | None, typer.Option("--marginals-cache", help="Keep the DLM's top-k block marginals here; a later run over the same rows (another lr, context or helper) skips the DLM.")] = None,
    marginals_top_k: Annotated[int | None, typer.Option("--marginals-top-k", help="With --marginals-cache: ids kept per position (the soft embedding uses these k). [default: 64]")] = None,
    seed: Annotated[int, typer.Option(help="Seed of windows, masks and blocks.", min=0, max=2**63 - 1)] = 0,
    resume: Annotated[bool, typer.Option(help="Continue the run in --output exactly where it stopped.")] = False,
    nproc: Annotated[int, typer.Option("--nproc", help="Processes on this machine (torchrun; one per GPU).")] = 1,
    device: Device = "auto",
    dtype: Annotated[str, typer.Option(help="The frozen DLM's dtype: auto (bf16 on CUDA, fp32 on a CPU), float32, bfloat16.")] = "auto",
    json_out: JsonOut = False,
    quiet: Quiet = False,
) -> None:
    """Align an AR helper to a DLM's marginals (CoDiLA §3.5); write a helper directory for --ar.

    Example: codila train align --dlm dream-coder --ar qwen3-0.6b --data ./src --output ./my-helper
    """
    from codila_cli.train.align import AlignConfig, parse_block_sizes, preflight, run

    if marginals_top_k is not None and marginals_cache is None:
        raise UsageError("--marginals-top-k applies with --marginals-cache only", hint="add --marginals-cache DIR")
    cfg = AlignConfig(dlm=dlm, ar=ar, data=data, output=output, field=field, glob=glob,
                      block_sizes=parse_block_sizes(block_sizes), steps=steps, batch=batch, grad_accum=grad_accum,
                      lr=lr, warmup=warmup, weight_decay=weight_decay, grad_clip=grad_clip, seq_len=seq_len,
                      blocks_per_row=blocks_per_row, context=context, context_share=context_share, frontier=frontier,
                      weighting=weighting, valid_fraction=valid_fraction, valid_every=valid_every, valid_rows=valid_rows,
                      ckpt_every=ckpt_every, select_decoding=select_decoding, optimizer=optimizer,
                      grad_checkpointing=grad_checkpointing, seed=seed, resume=resume, device=device, dtype=dtype,
                      marginals_cache=marginals_cache, marginals_top_k=64 if marginals_top_k is None else marginals_top_k)
    if not 1 <= nproc <= 64:
        raise UsageError(f"--nproc must be between 1 and 64, got {nproc}", hint="one process per GPU")
    if nproc > 1:  # fail here, once, rather than in every process
        from codila_cli.train.align.launch import torchrun

        preflight(cfg, world=nproc)
        code = torchrun(nproc, cfg)
        if code:
            raise CodilaError(f"a training process failed (torchrun exit {code}); its Error line is above",
                              hint="fix what it names and run again (add --resume if a checkpoint was written)")
        return
    from codila_cli.ui.progress import step_progress

    with step_progress("align", steps, quiet=quiet) as log:
        out = run(cfg, on_log=log)
    if "output" in out:
        _result("align", out, as_json=json_out)
        if not quiet:
            say(f"helper written to {out['output']}: codila gen --dlm {dlm} --ar {out['output']} \"…\"\n")


def _stage(name: str):
    """One bundled stage as a command: the same options for all, checked by train.options."""

    def command(run_dir: RunDir = Path("runs/bundled"), steps: Steps = 1000,
                data_dir: Annotated[Path | None, typer.Option(envvar="CODILA_DATA", help="corpus: benchmark data for decontamination (shared/data).")] = None,
                site: Annotated[Path | None, typer.Option("--site", help="corpus: read the packages of scripts/corpus-packages.txt from this `pip install --target` directory.")] = None,
                reuse: Annotated[Path | None, typer.Option("--reuse", help="tokenizer: keep this checkpoint's tokenizer (to continue its weights) instead of training one.")] = None,
                decoding: Annotated[list[str] | None, typer.Option("--decoding", help="export: KEY=VALUE for the helper's recommended codila_decoding (repeatable), KEY is a knob a helper may recommend (docs/settings.md); B8.KEY=VALUE for block size 8 only.")] = None,
                init: Annotated[Path | None, typer.Option("--init", help="sft, tasks: start from this Dream checkpoint directory; ar: continue this helper directory.")] = None,
                shape: Annotated[str, typer.Option("--shape", help="ar: helper shape, base (4.5M) or small (1.9M, session 1).")] = "base",
                frontier: Annotated[float | None, typer.Option("--frontier", help="sft: share of left-to-right (frontier) masks, 0..1. [default: 0]")] = None,
                bare_body: Annotated[str | None, typer.Option("--bare-body", help="sft: after a bare signature, the corpus's docstring and code (as-written) or the code only (code); ar: code also keeps each documented function once more without its docstring. [default: as-written]")] = None,
                batch: Annotated[int | None, typer.Option("--batch", help="model stages: rows per step. [default: the stage's own]")] = None,
                lr: Annotated[float | None, typer.Option("--lr", help="model stages: peak learning rate. [default: the stage's own]")] = None,
                seed: Annotated[int | None, typer.Option("--seed", help="model stages: seed of the weights' start and of the batches' order (a second pass over the corpus with another seed sees other windows). [default: the stage's own]")] = None,
                json_out: JsonOut = False,
                quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar; errors only.")] = False) -> None:
        from codila_cli.train import stages
        from codila_cli.train.options import (
            MODEL_STAGES,
            check_run_dir,
            check_stage_paths,
            export_decoding,
            stage_options,
        )

        if steps < 1:
            raise UsageError("--steps must be >= 1", hint="e.g. --steps 200")
        check_stage_paths(name, site=site, reuse=reuse)
        if decoding and name != "export":
            raise UsageError("--decoding applies to the export stage only", hint="drop --decoding for this stage")
        given = [f for f, v in (("--init", init), ("--frontier", frontier), ("--bare-body", bare_body),
                                ("--batch", batch), ("--lr", lr), ("--seed", seed),
                                ("--shape", None if shape == "base" else shape)) if v is not None]
        if given and name not in MODEL_STAGES:
            raise UsageError(f"{given[0]} applies to the model stages only ({', '.join(MODEL_STAGES)})",
                             hint=f"drop {given[0]} for the {name} stage")
        if name == "corpus":
            out = stages.stage_corpus(run_dir, data_dir=data_dir, site=site)
        elif name == "export":
            out = stages.stage_export(run_dir, ar_decoding=export_decoding(decoding or []))
        else:
            extra = stage_options(name, shape=shape, init=init, frontier=frontier, batch=batch, lr=lr,
                                  bare_body=bare_body, seed=seed) \
                if name in MODEL_STAGES else {}
            check_run_dir(name, run_dir)
            if name == "tokenizer":
                out = stages.stage_tokenizer(run_dir, reuse=reuse)
            else:
                from codila_cli.ui.progress import step_progress

                with step_progress(name, steps, quiet=quiet) as log:
                    out = getattr(stages, f"stage_{name}")(run_dir, steps=steps, on_log=log, **extra)
        _result(name, out, as_json=json_out)

    command.__doc__ = STAGE_HELP[name] + "\n\nDocs: docs/training.md lists the exact commands that made the shipped weights."
    command.__name__ = f"train_{name}"
    return command


STAGES = {name: _stage(name) for name in STAGE_HELP}
