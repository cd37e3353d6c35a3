"""Sweep decoders × K / B / τ over the held-out prompt set; write JSONL, a Markdown table and a PNG.

    python benchmarks/sweep.py --out results/sweep [--dlm bundled-dlm --ar bundled-ar] [--limit 120]
        [--settings dream:K=1 codila:B=4 ...] [--max-new-tokens 128]

Numbers are measured side by side in one run on the same prompts (docs/results.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from codila_cli.eval.heldout import load_heldout, markdown, pareto_plot, run_heldout, summarize
from codila_cli.eval.settings import PAPER_GRID, parse_setting
from codila_cli.runtime import default_ar, default_dlm, load_models


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dlm", default=None)
    ap.add_argument("--ar", default=None)
    ap.add_argument("--limit", type=int, default=120)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--settings", nargs="*", default=PAPER_GRID)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    models = load_models(dlm=args.dlm or default_dlm(), ar=args.ar or default_ar(), device="cpu", dtype="float32")
    prompts = load_heldout()[: args.limit]
    settings = [parse_setting(s, max_new_tokens=args.max_new_tokens) for s in args.settings]
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "rows.jsonl", "w") as fh:
        def log(row: dict) -> None:
            fh.write(json.dumps(row) + "\n")
            fh.flush()
        rows = run_heldout(models, prompts, settings, seed=args.seed, on_row=log)
    summary = summarize(rows)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    table = markdown(summary)
    (args.out / "summary.md").write_text(table)
    pareto_plot(summary, args.out / "pareto.png")
    sys.stdout.write(table)


if __name__ == "__main__":
    main()
