"""Peak memory of loading a checkpoint, per engine and dtype, against the size of its weights.

    python benchmarks/load_memory.py [--dir /tmp/codila-load-mem] [--out results/load-memory.md]

Builds one random Dream-layout DLM (codila_cli/train/shaped.py; 12 layers, hidden 1024, 30k vocabulary:
about 245 M parameters, 467 MiB in bf16) unless --dir already holds one, then loads it in a fresh
process per engine × dtype and reports the growth of peak RSS during `load_models` as a multiple of the
loaded weights. On a GPU the same multiple applies to device memory, which decides whether a 7B model
(15 GiB in bf16) loads on a 24 GiB card.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

CHILD = """
import resource, sys, time
import torch
from codila_cli.engine.models import load_models
torch.ones(1)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
t = time.perf_counter()
m = load_models(dlm=sys.argv[1], ar=None, device="cpu", dtype=sys.argv[2])
size = sum(p.numel() * p.element_size() for p in m.dlm.model.parameters()) / 2**20
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(f"{size:.0f} {peak - base:.0f} {time.perf_counter() - t:.2f}")
"""


def ensure_checkpoint(folder: Path) -> None:
    """The random 245 M-parameter Dream-layout DLM (and a tiny helper) in ``folder``, built once."""
    if (folder / "dlm" / "config.json").is_file():
        return
    from codila_cli.train.shaped import Shape, build_shaped

    dlm = Shape(hidden=1024, intermediate=4096, layers=12, heads=16, kv_heads=4, head_dim=64, extra_rows=421,
                tied=False, dream=True)
    ar = Shape(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, extra_rows=293,
               tied=True, dream=False)
    build_shaped(folder, dlm=dlm, ar=ar, ordinary=30000)


def cli_args() -> argparse.Namespace:
    """--dir (the checkpoint's folder, built once there) and --out (a file for the table); the checkpoint ready."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=Path("/tmp/codila-load-mem"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    ensure_checkpoint(args.dir)
    return args


def write_table(lines: list[str], out: Path | None) -> None:
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        out.write_text(text)


def main() -> None:
    args = cli_args()
    lines = ["| engine | dtype (file: bf16) | weights MiB | peak RSS growth MiB | × weights | seconds |",
             "|---|---|---|---|---|---|"]
    for engine in ("native", "transformers"):
        for dtype in ("bfloat16", "float32"):
            out = subprocess.run([sys.executable, "-c", CHILD, str(args.dir / "dlm"), dtype], capture_output=True,
                                 text=True, check=True, env={**os.environ, "CODILA_ENGINE": engine}).stdout.split()
            size, grow, secs = float(out[0]), float(out[1]), float(out[2])
            lines.append(f"| {engine} | {dtype} | {size:.0f} | {grow:.0f} | {grow / size:.2f}× | {secs:.2f} |")
    write_table(lines, args.out)


if __name__ == "__main__":
    main()
