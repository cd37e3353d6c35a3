"""The library's batching on this machine: ``generate_many`` of N prompts decoded together against the
same N prompts one after another, side by side in one process, interleaved over repeats (the median run
of each is reported; a 2-core VM's timings drift between runs of a few seconds).

    python benchmarks/batch_library.py [--rows 8] [--repeats 3] [--max-new-tokens 128] [--dtype float32]
        [--threads 1] [--out docs/results/batch-library-s29.json]

The prompts are the first N of the dev-ext set (as benchmarks/serve_load.py), greedy, seed 0; the settings
are the bundled helper's recommended CoDiLA setting (what `codila gen` and `codila serve` run) and the
plain DLM at K = 1. Also reported: whether every row decoded together gave its lone text.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {"codila (bundled default)": "codila:B=4,W=1,cond=topk:16,cache=prefix,cb=8,ctx=64,rp=1.5,sg=1,ng=8",
            "dream K=1": "dream:K=1"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: as each of a server's two lanes)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    import torch

    from codila_cli.engine.generate import generate, generate_many
    from codila_cli.engine.models import default_ar, default_dlm, load_models
    from codila_cli.eval.settings import parse_setting
    from codila_cli.provenance import provenance

    torch.set_num_threads(args.threads)
    models = load_models(dlm=default_dlm(), ar=default_ar(), device="cpu", dtype=args.dtype)
    rows = [json.loads(line) for line in (ROOT / "src/codila_cli/data/dev_ext_prompts.jsonl").open(encoding="utf-8")]
    prompts = [r["prompt"] for r in rows[: args.rows]]
    report = []
    for label, spec in SETTINGS.items():
        st = parse_setting(spec, max_new_tokens=args.max_new_tokens)
        generate_many(models, prompts[:2], decoder=st.decoder, config=st.config, seeds=[0, 0])  # warm-up
        serial, batch, same = [], [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            alone = [generate(models, p, decoder=st.decoder, config=st.config, seed=0) for p in prompts]
            serial.append(sum(r.metrics["tokens"] for r in alone) / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            out = generate_many(models, prompts, decoder=st.decoder, config=st.config, seeds=[0] * len(prompts))
            batch.append(sum(r.metrics["tokens"] for r in out.results) / (time.perf_counter() - t0))
            same.append(sum(a.text == b.text for a, b in zip(alone, out.results)))
        ratios = sorted(b / s for b, s in zip(batch, serial))
        report.append({"setting": label, "spec": spec, "rows": len(prompts),
                       "one_after_another_tokens_per_s": round(statistics.median(serial), 2),
                       "together_tokens_per_s": round(statistics.median(batch), 2),
                       "paired_ratio_median": round(statistics.median(ratios), 3),
                       "paired_ratio_min_max": [round(ratios[0], 3), round(ratios[-1], 3)],
                       "rows_identical_to_alone": min(same)})
    print("| setting | one after another, tokens/s | together | × (paired median, min–max) | rows as alone |")
    print("|---|---|---|---|---|")
    for r in report:
        lo, hi = r["paired_ratio_min_max"]
        print(f"| {r['setting']} | {r['one_after_another_tokens_per_s']} | {r['together_tokens_per_s']} | "
              f"{r['paired_ratio_median']:.2f} ({lo:.2f}–{hi:.2f}) | {r['rows_identical_to_alone']}/{r['rows']} |")
    if args.out:
        doc = {"command": "python benchmarks/batch_library.py " + " ".join(sys.argv[1:]), "threads": args.threads,
               "dtype": args.dtype, "repeats": args.repeats, "max_new_tokens": args.max_new_tokens, "results": report,
               "provenance": provenance(models, command=["python", "benchmarks/batch_library.py", *sys.argv[1:]])}
        args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
