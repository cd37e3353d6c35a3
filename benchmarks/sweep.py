"""Sweep decoders × K / B / τ (the CoDiLA paper's grid) on one benchmark; JSONL, Markdown, Pareto PNG.

    python benchmarks/sweep.py --out results/heldout [--benchmark heldout] [--limit 120]
        [--dlm bundled-dlm --ar bundled-ar] [--settings dream:K=1 codila:B=4 ...] [--max-new-tokens 128]
        [--batch-size 8]

Same as `codila eval --sweep`, kept as a script so it can run in the background and stream rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from codila_cli.engine.models import default_ar, default_dlm, load_models
from codila_cli.eval.benchmarks import load_tasks, select
from codila_cli.eval.runner import markdown, run_eval, write_outputs
from codila_cli.eval.settings import PAPER_GRID, parse_setting


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--benchmark", default="heldout")
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--dlm", default=None)
    ap.add_argument("--ar", default=None)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--settings", nargs="*", default=PAPER_GRID)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=1, help="completion tasks decoded together")
    ap.add_argument("--no-stop", action="store_true", help="no stop lines (as codila eval --no-stop)")
    args = ap.parse_args()
    models = load_models(dlm=args.dlm or default_dlm(), ar=args.ar or default_ar(), device="cpu", dtype="float32")
    tasks = select(load_tasks(args.benchmark, data=args.data_dir, stop=not args.no_stop), limit=args.limit, ids=None)
    settings = [parse_setting(s, max_new_tokens=args.max_new_tokens) for s in args.settings]
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "rows.jsonl", "w") as fh:
        def log(row: dict) -> None:
            fh.write(json.dumps(row) + "\n")
            fh.flush()
        rows = run_eval(models, tasks, settings, seed=args.seed, on_row=log, batch_size=args.batch_size)
    summary = write_outputs(args.out, rows, title=f"{args.benchmark} ({len(tasks)} tasks)")
    sys.stdout.write(markdown(summary))


if __name__ == "__main__":
    main()
