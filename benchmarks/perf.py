"""Speed benchmarks, measured side by side in one run (never timed assertions in tests).

    python benchmarks/perf.py --out results/perf [--prompts 12] [--max-new-tokens 128] [--dlm … --ar …]

Reports, on the same held-out prompts:
* tokens/s of every decoder setting and its ratio to the plain DLM at K = 1;
* the gain of each KV-cache mode (threshold and CoDiLA B = 4 with --cache none / prefix / dual);
* repeats: with --repeats N every setting runs N times, interleaved, and the median run is reported
  (a 2-core VM's timings drift by ±15 % between runs of a few seconds); ratios to plain K = 1 are also
  reported paired (repeat i over repeat i of K = 1, which ran at most minutes apart: median, min–max);
* sampler overhead: the share of decode wall time spent outside DLM and AR model forwards (and the
  shares inside DLM and inside AR forwards: the AR's share bounds what a DLM cache can gain); the
  part of it spent in CoDiLA's soft-embedding matmul (the AR's input layer, computed outside its
  forward) is reported apart;
* the live view's cost (CoDiLA B = 4 with the view rendering to a null terminal vs without);
* `codila --help` start-up time and the end-to-end time of a short `codila gen` on each engine
  (models/native.py vs transformers), and peak RSS;
* batching: tokens/s of N prompts decoded together (engine.generate.generate_many) vs one after another;
* `--compile`: tokens/s with torch.compile'd forwards vs eager on the same prompts, the one-off compile
  time (first prompt) reported apart (skip with --no-compile).
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from codila_cli.engine.generate import generate
from codila_cli.engine.models import default_ar, default_dlm, load_models
from codila_cli.eval.heldout import load_heldout
from codila_cli.eval.settings import parse_setting
from codila_cli.provenance import provenance

SETTINGS = ["dream:K=1", "dream:K=2", "dream:K=4", "threshold:0.9", "threshold:0.9,cache=prefix",
            "threshold:0.9,cache=dual", "codila:B=4", "codila:B=4,cache=prefix", "codila:B=4,cache=dual",
            "codila:B=4,tau=0.5", "codila:B=4,P=2",
            "codila:B=4,W=1,ctx=64,rp=1.3",  # R: the bundled helper's recommendation without its cache
            "codila:B=4,W=1,ctx=64,rp=1.3 noguess",  # the same, one AR forward per token (no guesses checked)
            "codila:B=4,W=1,ctx=64,rp=1.3,cache=prefix,cb=8",  # what `codila gen` runs on the bundled pair
            "codila:B=4,W=1,ctx=64,rp=1.3,cache=dual,cb=4"]
# A label ending in " noguess" runs the AR helper without checking guesses in its forwards
# (decoding/soft_ar.py: the same text, one forward per token), to measure what the guesses save.


def _sync(device: str) -> None:
    """Wait for queued GPU work, so that wall time lands on the side (forward or sampler) that queued it."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


class ForwardTimer:
    """Accumulates wall time spent inside a module's forward (pre/post hooks; on a GPU both hooks
    synchronise, so the forward's kernels count as forward time, not as the next sampler sync's)."""

    def __init__(self, module, device: str = "cpu") -> None:
        self.total = 0.0
        self._t = 0.0
        self.device = device
        module.register_forward_pre_hook(lambda *a: self._start())
        module.register_forward_hook(lambda *a: self._stop())

    def _start(self) -> None:
        _sync(self.device)
        self._t = time.perf_counter()

    def _stop(self) -> None:
        _sync(self.device)
        self.total += time.perf_counter() - self._t


def timed(cmd: list[str], n: int, env: dict | None = None) -> float:
    import os

    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=False, env={**os.environ, **(env or {})})
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dlm", default=None)
    ap.add_argument("--ar", default=None)
    ap.add_argument("--settings", nargs="*", default=SETTINGS)
    ap.add_argument("--batch", type=int, default=8, help="rows for the batching measurement")
    ap.add_argument("--repeats", type=int, default=1, help="runs per setting (interleaved); the median is reported")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile measurement")
    ap.add_argument("--no-startup", action="store_true", help="skip the `codila --help` / `codila gen` start-up timings")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (GPU forwards are timed with synchronisation)")
    ap.add_argument("--dtype", default="float32", help="float32 or bfloat16")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    exe = [sys.executable, "-m", "codila_cli"]
    short_gen = [*exe, "gen", "-q", "--max-new-tokens", "16", "--seed", "0", "def f(x):"]
    startup = {} if args.no_startup else {
        "help_seconds": timed([*exe, "--help"], 5), "gen_end_to_end_seconds": timed(short_gen, 3),
        "gen_end_to_end_seconds_transformers": timed(short_gen, 3, env={"CODILA_ENGINE": "transformers"})}
    models = load_models(dlm=args.dlm or default_dlm(), ar=args.ar or default_ar(), device=args.device, dtype=args.dtype)
    dlm_t = ForwardTimer(models.dlm.model, args.device)
    ar_t = ForwardTimer(models.ar.model, args.device) if models.ar is not None else None
    prompts = [p["prompt"] for p in load_heldout()[: args.prompts]]
    from codila_cli.decoding import soft_ar

    real_init = soft_ar.SoftBlockWriter.__init__
    real_embed = soft_ar.SoftBlockWriter.embed
    embed_seconds = [0.0]

    def timed_embed(self, q):  # the soft-embedding matmul: the AR's input layer, run outside its forward
        _sync(args.device)
        t0 = time.perf_counter()
        out = real_embed(self, q)
        _sync(args.device)
        embed_seconds[0] += time.perf_counter() - t0
        return out

    soft_ar.SoftBlockWriter.embed = timed_embed
    by_setting: dict[str, list[dict]] = {label: [] for label in args.settings}
    for label in args.settings:  # warm-up, untimed: the first decode of a setting pays one-off costs
        st = parse_setting(label.partition(" ")[0], max_new_tokens=args.max_new_tokens)
        generate(models, prompts[0], decoder=st.decoder, config=st.config, seed=0)
    for _ in range(args.repeats):
        for label in args.settings:
            spec, _, flag = label.partition(" ")
            guess = flag != "noguess"
            soft_ar.SoftBlockWriter.__init__ = lambda self, *a, g=guess, **kw: real_init(self, *a, **{**kw, "guess": g})
            st = parse_setting(spec, max_new_tokens=args.max_new_tokens)
            dlm_t.total = embed_seconds[0] = 0.0
            if ar_t:
                ar_t.total = 0.0
            tokens = wall = valid = ar_forwards = dlm_forwards = 0
            for p in prompts:
                r = generate(models, p, decoder=st.decoder, config=st.config, seed=0)
                tokens += r.metrics["tokens"]
                wall += r.metrics["wall_seconds"]
                ar_forwards += r.metrics["ar_forwards"]
                dlm_forwards += r.metrics["dlm_forwards"]
                valid += r.syntax.valid and bool(r.completion.strip())
            inside = dlm_t.total + (ar_t.total if ar_t else 0.0)
            by_setting[label].append({"setting": label, "tokens": tokens, "wall_seconds": wall,
                                "tokens_per_second": tokens / wall, "ar_forwards": ar_forwards,
                                "dlm_forwards": dlm_forwards, "ms_per_dlm_forward": 1e3 * dlm_t.total / max(1, dlm_forwards),
                                "ms_per_ar_forward": 1e3 * (ar_t.total if ar_t else 0.0) / max(1, ar_forwards),
                                "model_seconds": inside, "sampler_overhead": max(0.0, 1 - inside / wall),
                                "soft_embedding_share": embed_seconds[0] / wall,
                                "dlm_share": dlm_t.total / wall, "ar_share": (ar_t.total if ar_t else 0.0) / wall,
                                "valid_share": valid / len(prompts)})
    soft_ar.SoftBlockWriter.__init__ = real_init
    soft_ar.SoftBlockWriter.embed = real_embed
    rows = []
    base_runs = [r["tokens_per_second"] for r in by_setting["dream:K=1"]]
    for label, runs in by_setting.items():
        # paired ratios: repeat i of a setting over repeat i of dream K=1, which ran minutes apart at most
        paired = sorted(r["tokens_per_second"] / b for r, b in zip(runs, base_runs))
        rs = sorted(runs, key=lambda r: r["tokens_per_second"])
        rows.append({**rs[len(rs) // 2], "runs_tokens_per_second": [r["tokens_per_second"] for r in runs],
                     "paired_speedups": paired, "paired_speedup_median": statistics.median(paired)})
    base = next(r for r in rows if r["setting"] == "dream:K=1")["tokens_per_second"]
    for r in rows:
        r["speedup_vs_dream_k1"] = r["tokens_per_second"] / base
    # live view cost: render every event to a null terminal vs no view
    from rich.console import Console

    from codila_cli.ui.live import LiveView

    st = parse_setting("codila:B=4", max_new_tokens=args.max_new_tokens)
    plain = sum(generate(models, p, decoder="codila", config=st.config, seed=0).metrics["wall_seconds"] for p in prompts)
    con = Console(file=io.StringIO(), force_terminal=True, width=100)
    t_view = 0.0
    for p in prompts:
        with LiveView(tokenizer=models.dlm.tokenizer, mask_id=models.dlm.specials.mask, console=con, block_width=4) as v:
            t_view += generate(models, p, decoder="codila", config=st.config, seed=0, on_step=v).metrics["wall_seconds"]
    live = {"without_view_seconds": plain, "with_view_seconds": t_view, "overhead": t_view / plain - 1}
    batching = []
    from codila_cli.engine.generate import generate_many

    group = (prompts * ((args.batch // len(prompts)) + 1))[: args.batch]
    for label in ("dream:K=1", "codila:B=4"):
        st = parse_setting(label, max_new_tokens=args.max_new_tokens)
        generate_many(models, group[:2], decoder=st.decoder, config=st.config, seeds=[0, 0])  # warm-up, untimed
        t0 = time.perf_counter()
        singles = [generate(models, p, decoder=st.decoder, config=st.config, seed=0) for p in group]
        t_single = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = generate_many(models, group, decoder=st.decoder, config=st.config, seeds=[0] * len(group))
        t_batch = time.perf_counter() - t0
        tok_s = sum(r.metrics["tokens"] for r in singles)
        tok_b = sum(r.metrics["tokens"] for r in out.results)
        same = sum(a.text == b.text for a, b in zip(singles, out.results))
        batching.append({"setting": label, "rows": len(group), "single_tokens_per_second": tok_s / t_single,
                         "batch_tokens_per_second": tok_b / t_batch, "speedup": (tok_b / t_batch) / (tok_s / t_single),
                         "batched_forwards": out.batched_forwards, "identical_rows": same})
    compiled = []
    if not args.no_compile:
        cmodels = load_models(dlm=args.dlm or default_dlm(), ar=args.ar or default_ar(), device=args.device,
                              dtype=args.dtype, compile=True)
        for label in ("dream:K=1", "codila:B=4"):
            st = parse_setting(label, max_new_tokens=args.max_new_tokens)
            t0 = time.perf_counter()
            generate(cmodels, prompts[0], decoder=st.decoder, config=st.config, seed=0)  # compiles
            first = time.perf_counter() - t0
            runs = [generate(cmodels, p, decoder=st.decoder, config=st.config, seed=0) for p in prompts]
            eager = next(r for r in rows if r["setting"] == label)
            tps = sum(r.metrics["tokens"] for r in runs) / sum(r.metrics["wall_seconds"] for r in runs)
            compiled.append({"setting": label, "first_prompt_seconds": first, "tokens_per_second": tps,
                             "speedup_vs_eager": tps / eager["tokens_per_second"],
                             "valid_share": sum(r.syntax.valid and bool(r.completion.strip()) for r in runs) / len(runs)})
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report = {"startup": startup, "rows": rows, "live_view": live, "batching": batching, "compile": compiled,
              "peak_rss_mib": peak,
              "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
              "provenance": provenance(models, command=["python", "benchmarks/perf.py", *sys.argv[1:]])}
    (args.out / "perf.json").write_text(json.dumps(report, indent=2) + "\n")
    head = ("| setting | tokens/s | × dream K=1 | × dream K=1, paired (min–max) | in DLM forwards | in AR forwards | "
            "sampler overhead | of which soft embedding | forwards DLM / AR | ms per DLM / AR forward | valid |")
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["paired_speedups"]
        lines.append(f"| `{r['setting']}` | {r['tokens_per_second']:.1f} | {r['speedup_vs_dream_k1']:.2f}× | "
                     f"{r['paired_speedup_median']:.2f}× ({p[0]:.2f}–{p[-1]:.2f}) | "
                     f"{r['dlm_share']:.0%} | {r['ar_share']:.0%} | {r['sampler_overhead']:.1%} | "
                     f"{r['soft_embedding_share']:.1%} | {r['dlm_forwards']} / {r['ar_forwards']} | "
                     f"{r['ms_per_dlm_forward']:.2f} / {r['ms_per_ar_forward']:.2f} | {r['valid_share']:.0%} |")
    lines.append("")
    if startup:
        lines.append(f"* `codila --help`: {startup['help_seconds']:.2f} s; short `codila gen` end to end: "
                     f"{startup['gen_end_to_end_seconds']:.2f} s (native engine) vs "
                     f"{startup['gen_end_to_end_seconds_transformers']:.2f} s (CODILA_ENGINE=transformers)")
    lines += [(f"* live view: {live['overhead']:+.1%} decode time ({live['with_view_seconds']:.2f} s vs "
               f"{live['without_view_seconds']:.2f} s)"), f"* peak RSS: {peak:.0f} MiB"]
    if args.device.startswith("cuda"):
        import torch

        lines.append(f"* peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB; "
                     f"device {torch.cuda.get_device_name()}, dtype {args.dtype}")
    for b in batching:
        lines.append(f"* batch of {b['rows']} `{b['setting']}`: {b['batch_tokens_per_second']:.1f} tokens/s vs "
                     f"{b['single_tokens_per_second']:.1f} one at a time ({b['speedup']:.2f}×); "
                     f"{b['identical_rows']}/{b['rows']} rows identical to their single runs")
    for c in compiled:
        lines.append(f"* `--compile` `{c['setting']}`: {c['tokens_per_second']:.1f} tokens/s "
                     f"({c['speedup_vs_eager']:.2f}× eager; first prompt incl. compilation {c['first_prompt_seconds']:.1f} s)")
    (args.out / "perf.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
