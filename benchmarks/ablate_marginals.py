"""Does the DLM's plan reach the output? CoDiLA with the DLM's marginals vs the same helper reading
uniform marginals (every soft token = the mean embedding of the shared ids; committed slots stay one-hot).

    python benchmarks/ablate_marginals.py --out results/ablate [--limit 120] [--max-new-tokens 96]
        [--dlm bundled-dlm --ar bundled-ar] [--settings codila:B=4 codila:B=4,W=1,ctx=64,rp=1.2]

With uniform marginals the helper writes from its left context (if any) and its own prior; the block
order still comes from the DLM's entropies. The gap between the two rows is what the DLM's marginals add.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path

from codila_cli.engine.models import default_ar, default_dlm, load_models
from codila_cli.eval.benchmarks import load_tasks, select
from codila_cli.eval.runner import markdown, run_eval, write_outputs
from codila_cli.eval.settings import parse_setting


@contextmanager
def uniform_marginals():
    from codila_cli.decoding.soft_ar import SoftBlockWriter

    real = SoftBlockWriter.condition

    def condition(self, pi, forced):
        q = real(self, pi, forced)
        free = [j for j, tok in enumerate(forced) if tok is None]
        q[free] = 1.0 / q.shape[-1]
        return q

    SoftBlockWriter.condition = condition
    try:
        yield
    finally:
        SoftBlockWriter.condition = real


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dlm", default=None)
    ap.add_argument("--ar", default=None)
    ap.add_argument("--limit", type=int, default=120)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--settings", nargs="*", default=["codila:B=4", "codila:B=4,W=1,ctx=64,rp=1.2"])
    args = ap.parse_args()
    models = load_models(dlm=args.dlm or default_dlm(), ar=args.ar or default_ar(), device="cpu", dtype="float32")
    tasks = select(load_tasks("heldout", data=None), limit=args.limit, ids=None)
    settings = [parse_setting(s, max_new_tokens=args.max_new_tokens) for s in args.settings]
    rows = run_eval(models, tasks, settings, seed=0)
    with uniform_marginals():
        ablated = run_eval(models, tasks, settings, seed=0)
    for r in ablated:
        r["setting"] += " [uniform π]"
    summary = write_outputs(args.out, rows + ablated, title=f"heldout ({len(tasks)} tasks): DLM marginals vs uniform")
    sys.stdout.write(markdown(summary))


if __name__ == "__main__":
    main()
