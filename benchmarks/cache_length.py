"""The KV caches' gain as a function of the canvas length, measured side by side in one run.

    python benchmarks/cache_length.py --out results/cache-length [--lengths 96 128 320] [--prompts 6] [--repeats 3]

A cached step recomputes only the cache's window (dual) or the window and what follows (prefix); an
uncached forward recomputes the whole sequence. So the gain grows with the canvas: Fast-dLLM reports
its 3–11× at 256–1024 generated tokens. For each length, every setting runs on the same held-out
prompts, interleaved ``--repeats`` times (the median run is reported); gains are paired (repeat i over
repeat i of the uncached setting). Prompts whose tokens plus the canvas exceed the DLM's context are
skipped (and counted).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from codila_cli.engine.generate import context_overflow, generate
from codila_cli.engine.models import default_ar, default_dlm, load_models
from codila_cli.eval.heldout import load_heldout
from codila_cli.eval.runner import reference_label
from codila_cli.eval.settings import parse_setting

R = "codila:B=4,W=1,ctx=64,rp=1.3"  # the bundled helper's recommendation without its cache
# R with prefix,cb=8 is what `codila gen` runs on the bundled pair (its recommended cache)
SETTINGS = [R, f"{R},cache=prefix,cb=8", f"{R},cache=dual,cb=4", "threshold:0.9", "threshold:0.9,cache=dual"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--lengths", type=int, nargs="+", default=[96, 128, 320])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--settings", nargs="*", default=SETTINGS)
    args = ap.parse_args()
    models = load_models(dlm=default_dlm(), ar=default_ar(), device="cpu", dtype="float32")
    prompts = [p["prompt"] for p in load_heldout()[: args.prompts]]
    report = []
    for L in args.lengths:
        parsed = {label: parse_setting(label, max_new_tokens=L) for label in args.settings}
        fits = [p for p in prompts if context_overflow(models, p, config=parsed[args.settings[0]].config) is None]
        runs: dict[str, list[dict]] = {label: [] for label in args.settings}
        texts: dict[str, list[str]] = {}  # the first repeat's completions, to compare with the uncached ones
        for _ in range(args.repeats):
            for label, st in parsed.items():  # interleaved: every setting once per repeat
                tokens = forwards = 0
                t0 = time.perf_counter()
                for i, p in enumerate(fits):
                    r = generate(models, p, decoder=st.decoder, config=st.config, seed=i)
                    if len(texts.get(label, [])) < len(fits):
                        texts.setdefault(label, []).append(r.completion)
                    tokens += r.metrics["tokens"]
                    forwards += r.metrics["dlm_forwards"]
                runs[label].append({"tokens": tokens, "seconds": time.perf_counter() - t0, "dlm_forwards": forwards})
        for label in args.settings:
            tps = [r["tokens"] / r["seconds"] for r in runs[label]]
            row = {"length": L, "setting": label, "prompts": len(fits), "skipped": len(prompts) - len(fits),
                   "tokens_per_second": statistics.median(tps), "dlm_forwards": runs[label][0]["dlm_forwards"]}
            base_label = reference_label(label)  # the same setting without cache= / cb=
            if base_label in runs:
                base = [r["tokens"] / r["seconds"] for r in runs[base_label]]
                paired = [a / b for a, b in zip(tps, base)]
                row.update(gain=statistics.median(tps) / statistics.median(base), paired_gain=statistics.median(paired),
                           paired_range=[min(paired), max(paired)],
                           identical=sum(a == b for a, b in zip(texts[label], texts[base_label])))
            report.append(row)
            print(json.dumps(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    lines = ["| canvas | setting | prompts | tokens/s | gain over no cache | paired (range) | identical texts | DLM forwards |",
             "|---|---|---|---|---|---|---|---|"]
    for r in report:
        gain = f"{r['gain']:.2f}×" if "gain" in r else "–"
        paired = (f"{r['paired_gain']:.2f}× ({r['paired_range'][0]:.2f}–{r['paired_range'][1]:.2f})"
                  if "gain" in r else "–")
        same = f"{r['identical']} / {r['prompts']}" if "gain" in r else "–"
        lines.append(f"| {r['length']} | `{r['setting']}` | {r['prompts']} | {r['tokens_per_second']:.1f} | {gain} | "
                     f"{paired} | {same} | {r['dlm_forwards']} |")
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
