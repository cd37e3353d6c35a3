"""What ``--exact`` (FreeDave, decoding/freedave.py) saves and costs, side by side in one run against the
one-token-per-step decode it reproduces.

    python benchmarks/exact.py [--dir /tmp/codila-quant] [--out docs/results/exact-s34.md]
                               [--models bundled,sdar-1.7b,dream-7b-4l,llada-8b-4l] [--tokens 128,256]
                               [--infill 20 --data ../shared/data]

For each model and length: the reference decode (Dream's ``steps = max_new_tokens``, LLaDA's one token per
step in blocks of 32, the block sampler's static schedule one token per step in blocks of 4; all at T 0)
and the same with ``exact=True``, one after the other in one process, each on the same prompts: identical
texts (counted: fp32 promises all; bf16 within its tolerance, docs/decoders.md), sequential forwards, canvases evaluated (the compute), tokens per sequential forward,
and the wall-clock ratio reference ÷ exact (> 1: exact is faster).

Models, each in fp32 and bf16 (--dtypes): the bundled DLM (its held-out prompts, the first 4 of
data/heldout_ext5_prompts.jsonl), and the real-width random checkpoints of benchmarks/quantize.py
(built once under --dir: SDAR-1.7B whole, Dream-Coder-7B's and LLaDA-8B's widths with 4 layers, and with
``--models …,sdar-8b-4l`` SDAR-8B's width with 4 layers; ``sdar-tiny``: the tests' tiny SDAR, a dry run), whose head
is drawn with a trained model's spread (HEAD_STD there; the median top-1 probability of the first forward
is printed) so that confidences rank as on real weights. Stable-DiffCoder runs the block sampler's code
path that SDAR-1.7B measures (its rules differ in the draws, not in what a verification forward costs).

``--infill N``: DreamOn's fills instead (decoding/dreamon.py, and ``fill_exact``), the bundled infill model on
the first N tasks of HumanEval-MultiLineInfilling (``--data``; the data the eval reads, not tuned on), its
default settings (a 64-token middle, one slot a step) at T 0 and ``--initial-masks`` n0 (4, the default, and
16): the middles, the same counts.

On a CPU a verification forward of d canvases costs about d forwards: this is the measurement the default
(``--exact`` off on a CPU, on with CUDA) follows. scripts/gpu_exact.sh measures the same on a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def _configs(decoder: str, tokens: int):
    from codila_cli.decoding.block import BlockConfig
    from codila_cli.decoding.config import DreamConfig
    from codila_cli.decoding.llada import LladaConfig

    if decoder == "dream":
        return DreamConfig(max_new_tokens=tokens, early_stop=False)
    if decoder == "llada":
        return LladaConfig(max_new_tokens=tokens, block_length=32, early_stop=False)
    return BlockConfig(max_new_tokens=tokens, block_length=4, remasking="low_confidence", early_stop=False)


def measure(path: str, decoder: str, tokens: int, prompts: list[str], dtype: str, device: str = "cpu") -> dict:
    import torch

    from codila_cli.engine.generate import generate
    from codila_cli.engine.models import load_models

    m = load_models(dlm=path, ar=None, device=device, dtype=dtype)
    ids = m.dlm.tokenizer.encode(prompts[0], add_special_tokens=False)
    with torch.inference_mode():
        top1 = float(m.dlm.model(input_ids=torch.tensor([ids], device=m.dlm.device)).logits.float().softmax(-1)
                     .amax(-1).median())
    cfg = _configs(decoder, tokens)
    row = {"model": path.split("/")[-1], "tokens": tokens, "dtype": str(m.dlm.ckpt.dtype).removeprefix("torch."),
           "top1": top1}
    for c in (replace(cfg, exact=False), replace(cfg, exact=True)):  # warm-up, not timed (a GPU's first kernels
        generate(m, prompts[0], decoder=decoder, config=replace(c, max_new_tokens=min(tokens, 32)), seed=0)  # and
    for name, c in (("ref", replace(cfg, exact=False)), ("exact", replace(cfg, exact=True))):  # batch shapes)
        t, outs = time.perf_counter(), []
        for p in prompts:
            outs.append(generate(m, p, decoder=decoder, config=c, seed=0))
        row[name] = {"seconds": time.perf_counter() - t, "texts": [r.completion for r in outs],
                     "forwards": sum(r.metrics["dlm_forwards"] for r in outs),
                     "rows": sum(r.metrics["dlm_rows"] for r in outs),
                     "generated": sum(r.metrics["tokens"] for r in outs)}
    row["identical"] = sum(a == b for a, b in zip(row["ref"]["texts"], row["exact"]["texts"]))
    row["texts"] = len(prompts)
    return row


def measure_infill(path: str, n: int, data: Path, dtype: str, device: str = "cpu", n0: int = 4) -> dict:
    from codila_cli.decoding.config import InfillConfig
    from codila_cli.engine.models import load_models
    from codila_cli.engine.tasks import infill_tokens
    from codila_cli.eval.benchmarks import load_tasks, select

    m = load_models(dlm=path, ar=None, device=device, dtype=dtype)
    tasks = select(load_tasks("he-infill-multi", data=data), limit=n, ids=None)
    row = {"model": path, "tokens": f"fill, n0 {n0}", "dtype": str(m.dlm.ckpt.dtype).removeprefix("torch."), "top1": None}
    infill_tokens(m, tasks[0].prompt, tasks[0].suffix, config=InfillConfig(), seed=0)  # warm-up, not timed
    for name, exact in (("ref", False), ("exact", True)):
        t, outs = time.perf_counter(), []
        for task in tasks:
            outs.append(infill_tokens(m, task.prompt, task.suffix, config=InfillConfig(initial_masks=n0, exact=exact),
                                      seed=0)[0])
        row[name] = {"seconds": time.perf_counter() - t, "texts": [r.middle for r in outs],
                     "forwards": sum(r.dlm_forwards for r in outs),
                     "rows": sum(r.dlm_rows for r in outs),
                     "generated": sum(len(r.middle) + r.expansions + r.deletions for r in outs)}
    row["identical"] = sum(a == b for a, b in zip(row["ref"]["texts"], row["exact"]["texts"]))
    row["texts"] = len(tasks)
    return row


def main() -> None:
    from quantize import _cpu, ensure

    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/codila-quant")
    ap.add_argument("--out", default=None)
    ap.add_argument("--models", default="bundled,sdar-1.7b,dream-7b-4l,llada-8b-4l")
    ap.add_argument("--tokens", default="128,256")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--infill", type=int, default=0, help="measure DreamOn fills of this many tasks instead")
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--initial-masks", default="4,16", help="with --infill: the fills' n0 values")
    args = ap.parse_args()
    heldout = [json.loads(line)["prompt"] for line in
               (ROOT / "src/codila_cli/data/heldout_ext5_prompts.jsonl").read_text().splitlines()[:4]]
    rows = []
    for n0, dtype in ((int(k), d) for k in args.initial_masks.split(",") for d in args.dtypes.split(",")
                      if args.infill):
        rows.append(r := measure_infill("bundled-infill", args.infill, Path(args.data), dtype, args.device, n0))
        print(json.dumps({k: v if not isinstance(v, dict) else {a: b for a, b in v.items() if a != "texts"}
                          for k, v in r.items()}), flush=True)
    for which in args.models.split(",") if not args.infill else ():
        dtypes = args.dtypes.split(",")
        if which == "bundled":
            path, decoder, prompts = "bundled-dlm", "dream", heldout
        else:
            built, decoder = ensure(Path(args.dir), which)
            path, prompts = str(built), ["def f(x):"]
            decoder = {"threshold": "dream"}.get(decoder, decoder)  # the Dream width: its own sampler
        for tokens, dtype in ((int(t), d) for t in args.tokens.split(",") for d in dtypes):
            r = measure(path, decoder, tokens, prompts, dtype, args.device)
            rows.append(r)
            print(json.dumps({k: v if not isinstance(v, dict) else {a: b for a, b in v.items() if a != "texts"}
                              for k, v in r.items()}), flush=True)
    lines = [("| model | dtype | top-1 p (median) | new tokens | sequential forwards ref → exact | canvases evaluated "
             "(exact) | tokens per sequential forward ref → exact | wall ref ÷ exact | texts identical |"),
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a, b = r["ref"], r["exact"]
        top1 = "–" if r["top1"] is None else f"{r['top1']:.2f}"
        lines.append(f"| {r['model']} | {r['dtype']} | {top1} | {r['tokens']} | {a['forwards']} → {b['forwards']} | "
                     f"{b['rows']} | {a['generated'] / a['forwards']:.2f} → {b['generated'] / b['forwards']:.2f} | "
                     f"{a['seconds'] / b['seconds']:.2f}× | {r['identical']} of {r['texts']} |")
    import torch

    where = (f"GPU: {torch.cuda.get_device_name()}" if args.device.startswith("cuda")
             else f"CPU: {_cpu()}, {torch.get_num_threads()} threads")
    text = "\n".join([f"{where}, torch {torch.__version__}.", "", *lines])
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
