"""Issue 26's targets for the offline default, measured (a benchmark, not a test).

    python benchmarks/offline_default.py --out results/offline [--pair NAME=DLM,AR ...] [--benchmark heldout-ext]
        [--gen-runs 3] [--skip-quality]

For each pair (default: the bundled one; e.g. ``--pair s12=old/dlm,old/ar --pair s13=bundled-dlm,bundled-ar``
measures an old and a new pair side by side in one run):

* quality on the benchmark (default heldout-ext: 120 prompts from packages outside the corpus) with the
  default settings (what ``codila gen`` runs: the helper's recommendation), CoDiLA at K = B = 8 with the
  helper's recommendation for B = 8 (what ``codila gen -B 8`` runs), and the plain DLM at K = 8: valid (parses, non-empty), valid and not repetitive,
  syntax-error rate, and the ratio of CoDiLA's to the DLM's syntax-error rate at K = 8 (target ≤ 1/3);
* the six everyday prompts (``-b everyday``) with the default settings: each completion verbatim and
  whether its test passed (run in the eval sandbox; needs bubblewrap, or pass --unsafe-local-exec);
* the wall time of a 128-token ``codila gen "def fib(n):"`` in a fresh process, start-up included (the
  median of --gen-runs runs, interleaved across pairs);
* the size of the model files.

Writes ``OUT/summary.json`` and ``OUT/summary.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from codila_cli.engine.models import load_models
from codila_cli.eval.benchmarks import load_tasks
from codila_cli.eval.runner import run_eval, summarize
from codila_cli.eval.sandbox import SandboxLimits
from codila_cli.eval.settings import parse_setting, recommended_label
from codila_cli.helper_card import recommended_decoding


def _pair(text: str) -> tuple[str, str, str]:
    name, _, models = text.partition("=")
    dlm, _, ar = models.partition(",")
    if not (name and dlm and ar):
        raise SystemExit(f"--pair wants NAME=DLM,AR, got {text!r}")
    return name, dlm, ar


def _size(spec: str, kind: str) -> int:
    from codila_cli.models.cache import resolve_local_dir
    from codila_cli.models.registry import resolve_spec

    path = resolve_local_dir(resolve_spec(spec, kind=kind))
    return sum(f.stat().st_size for f in Path(path).iterdir() if f.is_file())


def _gen_seconds(dlm: str, ar: str) -> float:
    env = {**os.environ, "CODILA_CONFIG": os.devnull}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "codila_cli", "gen", "--dlm", dlm, "--ar", ar, "--max-new-tokens", "128",
                        "-q", "def fib(n):"], capture_output=True, text=True, env=env, check=False)
    if r.returncode != 0:
        raise SystemExit(f"codila gen failed: {r.stderr[-500:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--pair", action="append", default=[])
    ap.add_argument("--benchmark", default="heldout-ext")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--gen-runs", type=int, default=3)
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--unsafe-local-exec", action="store_true")
    args = ap.parse_args()
    pairs = [_pair(p) for p in args.pair] or [("bundled", "bundled-dlm", "bundled-ar")]
    args.out.mkdir(parents=True, exist_ok=True)
    out: dict = {"benchmark": args.benchmark, "max_new_tokens": args.max_new_tokens, "pairs": {}}
    for name, dlm, ar in pairs:
        rec = recommended_label(recommended_decoding(ar))
        res: dict = {"dlm": dlm, "ar": ar, "default_setting": rec, "bytes": _size(dlm, "dlm") + _size(ar, "ar")}
        if not args.skip_quality:
            models = load_models(dlm=dlm, ar=ar, device="cpu", dtype="auto")
            k8 = recommended_label({**recommended_decoding(ar, block_size=8), "block_size": 8})  # what `gen -B 8` runs
            labels = list(dict.fromkeys([rec, k8, "dream:K=8"]))  # the default may be K = B = 8 itself
            settings = [parse_setting(s, max_new_tokens=args.max_new_tokens) for s in labels]
            rows = run_eval(models, load_tasks(args.benchmark), settings, seed=0)
            res["quality"] = {s["setting"]: s for s in summarize(rows)}
            errs = {lab: res["quality"][lab]["syntax_error_rate"] for lab in labels}
            res["error_ratio_codila_k8_over_dlm_k8"] = errs[k8] / errs["dream:K=8"] if errs["dream:K=8"] else None
            every = run_eval(models, load_tasks("everyday"), [settings[0]], seed=0,
                             limits=SandboxLimits(unsafe_local_exec=args.unsafe_local_exec))
            res["everyday"] = [{"task_id": r["task_id"], "passed": r["passed"], "status": r.get("status"),
                                "completion": r["completion"]} for r in every]
        out["pairs"][name] = res
    for name, dlm, ar in pairs:
        out["pairs"][name]["gen_seconds"] = []
    for _ in range(args.gen_runs):  # interleaved, so drift hits every pair alike
        for name, dlm, ar in pairs:
            out["pairs"][name]["gen_seconds"].append(round(_gen_seconds(dlm, ar), 2))
    for res in out["pairs"].values():
        res["gen_seconds_median"] = statistics.median(res["gen_seconds"])
    from codila_cli.provenance import provenance

    out["provenance"] = provenance(command=["python", "benchmarks/offline_default.py", *sys.argv[1:]])
    (args.out / "summary.json").write_text(json.dumps(out, indent=2) + "\n")
    (args.out / "summary.md").write_text(markdown(out))
    sys.stdout.write(markdown(out))


def markdown(out: dict) -> str:
    lines = [f"# Offline default ({out['benchmark']}, {out['max_new_tokens']} new tokens)", ""]
    lines += ["| pair | setting | valid | valid, not repetitive | syntax errors |", "|---|---|---|---|---|"]
    for name, res in out["pairs"].items():
        for label, s in res.get("quality", {}).items():
            lines.append(f"| {name} | `{label}` | {s['syntax_valid']:.1%} | {s['valid_not_repetitive']:.1%} | "
                         f"{s['syntax_error_rate']:.1%} |")
    lines += ["", "| pair | CoDiLA K=B=8 errors / DLM K=8 errors | everyday passed | 128-token gen (s, median) | model files (MB) |",
              "|---|---|---|---|---|"]
    for name, res in out["pairs"].items():
        ratio = res.get("error_ratio_codila_k8_over_dlm_k8")
        passed = sum(bool(e["passed"]) for e in res.get("everyday", []))
        lines.append(f"| {name} | {'–' if ratio is None else f'{ratio:.2f}'} | {passed} / {len(res.get('everyday', []))} | "
                     f"{res['gen_seconds_median']:.2f} ({', '.join(map(str, res['gen_seconds']))}) | {res['bytes'] / 1e6:.1f} |")
    for name, res in out["pairs"].items():
        for e in res.get("everyday", []):
            lines += ["", f"**{name} · {e['task_id']}** ({'passed' if e['passed'] else e['status']})", "", "```python",
                      e["completion"].rstrip("\n"), "```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
