"""Training throughput and peak memory of ``codila train align`` (issue 24), on any pair.

    python benchmarks/align_throughput.py                                # the bundled pair, stdlib code, CPU
    python benchmarks/align_throughput.py --dlm DIR --ar DIR --device cuda --seq-len 2048 --batch 8
                                                                         # scripts/gpu_align.sh: 7B shapes

Runs the real command's library entry (codila_cli.train.align.run) for ``--steps`` steps in a temporary
output directory and reports, from its log: seconds per step (median after the first ``--skip``),
DLM tokens/s (rows × seq_len per second), helper blocks/s, peak RSS and peak GPU memory. A benchmark,
not a test: numbers go to stdout (Markdown) and to ``--json``.

``--cache-compare`` runs the same steps three times side by side: without ``--marginals-cache``, with
an empty cache (the run that writes it) and with the full one (a second run that reads it: another
learning rate, context or helper), and reports each one's seconds per step and its ratio to the first.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dlm", default="bundled-dlm")
    ap.add_argument("--ar", default="bundled-ar")
    ap.add_argument("--data", default=sysconfig.get_paths()["stdlib"], help="default: this Python's stdlib")
    ap.add_argument("--glob", default="*.py")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the median")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--blocks-per-row", type=int, default=8)
    ap.add_argument("--block-sizes", default="2,4,8")
    ap.add_argument("--context", type=int, default=48)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--grad-checkpointing", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--marginals-top-k", type=int, default=64)
    ap.add_argument("--cache-compare", action="store_true", help="no cache, writing it, reading it: side by side")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if not args.cache_compare:
        row = measure(args)
        rows = [row]
        sys.stdout.write("| pair | device | batch × seq | s/step | DLM tokens/s | blocks/s | peak RSS | peak GPU |\n"
                         "|---|---|---|---|---|---|---|---|\n"
                         f"| {args.dlm} + {args.ar} | {args.device} | {args.batch} × {args.seq_len} "
                         f"| {row['seconds_per_step']} | {row['tokens_per_second']} | {row['blocks_per_second']} "
                         f"| {row['peak_rss_mib']} MiB | {'-' if row['peak_gpu_gib'] is None else row['peak_gpu_gib']} |\n")
    else:
        with tempfile.TemporaryDirectory() as cache:
            rows = [measure(args, cache=None), measure(args, cache=Path(cache)), measure(args, cache=Path(cache))]
            cache_mib = sum(f.stat().st_size for f in Path(cache).rglob("*") if f.is_file()) / 2**20
        base = rows[0]["seconds_per_step"]
        sys.stdout.write(f"{args.dlm} + {args.ar}, {args.device}, batch {args.batch} × {args.seq_len}, "
                         f"top-k {args.marginals_top_k}, cache {cache_mib:.1f} MiB for {args.steps} steps\n\n"
                         "| run | s/step | ratio to no cache | final loss |\n|---|---|---|---|\n")
        for name, row in zip(("no cache", "writing the cache", "reading the cache"), rows):
            row["mode"] = name
            sys.stdout.write(f"| {name} | {row['seconds_per_step']} | {row['seconds_per_step'] / base:.2f} "
                             f"| {row['final_loss']} |\n")
        rows[0]["cache_mib"] = round(cache_mib, 2)
    if args.json:
        args.json.write_text(json.dumps(rows if len(rows) > 1 else rows[0], indent=2) + "\n")


def measure(args: argparse.Namespace, *, cache: Path | None = None) -> dict:
    import torch

    from codila_cli.train.align import AlignConfig, parse_block_sizes, run

    with tempfile.TemporaryDirectory() as tmp:
        cfg = AlignConfig(dlm=args.dlm, ar=args.ar, data=args.data, glob=args.glob, output=Path(tmp) / "helper",
                          steps=args.steps, batch=args.batch, seq_len=args.seq_len, blocks_per_row=args.blocks_per_row,
                          block_sizes=parse_block_sizes(args.block_sizes), context=args.context, device=args.device,
                          grad_checkpointing=args.grad_checkpointing, valid_every=10**9, ckpt_every=10**9,
                          select_decoding=0, warmup=1, marginals_cache=cache, marginals_top_k=args.marginals_top_k)
        t0 = time.perf_counter()
        last = run(cfg)
        wall = time.perf_counter() - t0
        log = [json.loads(line) for line in (cfg.state_dir / "log.jsonl").read_text().splitlines()]
    steps = log[args.skip :] or log
    tokens_per_second = statistics.median(r["tokens_per_second"] for r in steps)
    med = args.batch * args.seq_len / tokens_per_second  # the log's tokens/s is rows × seq_len / step time
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    gpu = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    row = {"dlm": args.dlm, "ar": args.ar, "device": args.device, "batch": args.batch, "seq_len": args.seq_len,
           "blocks_per_row": args.blocks_per_row, "steps": len(log), "seconds_per_step": round(med, 4),
           "tokens_per_second": round(tokens_per_second, 1),
           "blocks_per_second": round(statistics.median(r["blocks_per_second"] for r in steps), 2),
           "peak_rss_mib": round(rss), "peak_gpu_gib": round(gpu, 2) if gpu is not None else None,
           "wall_seconds_with_loading": round(wall, 1), "final_loss": last.get("loss"),
           "torch": torch.__version__, "threads": torch.get_num_threads(),
           "dlm_forwards": sum(r.get("dlm_forwards", 1) for r in log)}
    return row


if __name__ == "__main__":
    main()
