"""What 8- and 4-bit weights (``--quantize``, models/quantize.py) cost and change, side by side in one run.

    python benchmarks/quantize.py [--dir /tmp/codila-quant] [--out docs/results/quantize-s32.md]
                                  [--models sdar-1.7b,dream-7b-4l,llada-8b-4l] [--prompts 60] [--tokens 64]
                                  [--device cpu|cuda]

1. Real-width random checkpoints, written once under --dir in the released layouts (config keys, tensor
   names, bf16 safetensors; the fixtures' tokenizers, so the vocabulary is cut to their rows):
   SDAR-1.7B whole (28 layers, hidden 2048, 16/8 heads of 128, MLP 6144: 1.41 B parameters with a 576-row
   vocabulary), and Dream-Coder-7B's, LLaDA-8B's and SDAR-8B's widths (``sdar-8b-4l``: hidden 4096, 32/8
   heads of 128, MLP 12288, its own head) with 4 of their 28 / 32 / 36 layers. The output head
   is drawn with a larger spread (std HEAD_STD / sqrt(hidden)) so that a position's top token has a
   trained model's confidence (median top-1 probability printed), and the block and threshold decoders
   commit as they do on real weights. Each scheme (bf16, int8, int4) runs in a fresh process: the RSS
   after decoding (what the model holds), the peak RSS (VmHWM, reset before loading: it also counts the
   stored file's pages that loading maps and reads once, which the kernel may reclaim) and the peak
   anonymous memory (sampled every 1 ms), each over the process's own; load seconds, tokens/s of a
   64-token gen with the family's own decoder, the share of tokens equal to bf16's, and the fit check's
   estimate (models/fit.py::Need.total) against what the load needed: the larger of the peak anonymous memory
   (a quantized load's codes and transients) and the RSS after decoding (a bf16 load's mapped weights).
2. The bundled pair (DLM and helper both quantized) on held-out prompts (data/heldout_ext5_prompts.jsonl,
   the first --prompts of them; no setting of quantization was chosen on them: there is none to choose):
   texts equal to bf16's, syntax-valid share, tokens/s.

Everything on the CPU, torch's thread count as set (2 here), unless ``--device cuda`` (scripts/gpu_quantize.sh):
then the memory columns are the GPU's (torch's peak allocated bytes, and those allocated after decoding).
``--models sdar-tiny`` runs the tests' tiny SDAR checkpoint: a dry run in seconds. Each scheme decodes a short
warm-up before it is timed.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
HEAD_STD = 6.0  # logit spread of the head: a random hidden state of unit RMS gives logits of about this std
SCHEMES = ("none", "int8", "int4")

CHILD = r"""
import json, sys, threading, time
import torch
torch.set_num_threads(int(sys.argv[4]))
from codila_cli.engine.models import load_models, sized
from codila_cli.models.cache import resolve_local_dir
from codila_cli.models.registry import resolve_spec
path, scheme, decoder, tokens, device = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[5]), sys.argv[6]
cuda = device.startswith("cuda")
def status(key):  # on CUDA: the device's memory (allocated by torch; "VmHWM" its peak), else the process's
    if cuda:
        return torch.cuda.max_memory_allocated() if key == "VmHWM" else torch.cuda.memory_allocated()
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) * 1024
dt = torch.bfloat16
from codila_cli.models.fit import canvas_for
(need,), _ = sized([(path, resolve_local_dir(resolve_spec(path, kind="dlm")), dt, scheme)], canvas=canvas_for(tokens))
peak_anon = [0]
stop = threading.Event()
def sample():
    while not stop.is_set():
        peak_anon[0] = max(peak_anon[0], status("RssAnon"))
        time.sleep(0.001)
if cuda:
    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats()
else:
    open("/proc/self/clear_refs", "w").write("5")
base, base_anon = status("VmRSS"), status("RssAnon")
if not cuda:  # on CUDA the device's own peak is read after decoding
    threading.Thread(target=sample, daemon=True).start()
t = time.perf_counter()
m = load_models(dlm=path, ar=None, device=device, dtype="bfloat16", quantize=scheme)
if cuda:
    torch.cuda.synchronize()
load_s = time.perf_counter() - t
from codila_cli.resolve import resolve_gen
from codila_cli.config import load_config
from codila_cli.engine.generate import generate
from dataclasses import replace
req = resolve_gen({"decoder": decoder, "max_new_tokens": tokens}, user=load_config(), dlm=path, ar=None)
prompt = " ".join(f"t{i}" for i in range(3, 40)) if m.dlm.tokenizer.get_vocab().get("t3") is not None else "def f(x):"
ids = m.dlm.tokenizer.encode(prompt, add_special_tokens=False)[:32]
with torch.inference_mode():
    probs = m.dlm.model(input_ids=torch.tensor([ids], device=m.dlm.device)).logits.float().softmax(-1).amax(-1)
top1 = float(probs.median())
generate(m, prompt, decoder=req.decoder, config=replace(req.config, max_new_tokens=min(tokens, 8)), seed=0)  # warm-up
t = time.perf_counter()
r = generate(m, prompt, decoder=req.decoder, config=req.config, seed=0)
dec_s = time.perf_counter() - t
stop.set()
if cuda:
    peak_anon[0] = torch.cuda.max_memory_allocated()
out = {"load_s": load_s, "tok_s": r.metrics["tokens"] / dec_s, "tokens": r.metrics["tokens"],
       "ids": m.dlm.tokenizer.encode(r.completion, add_special_tokens=False), "peak": status("VmHWM") - base,
       "rss": status("VmRSS") - base,
       "peak_anon": peak_anon[0] - base_anon, "estimate": need.total,
       "top1": top1, "forwards": r.metrics.get("dlm_forwards")}
print(json.dumps(out))
"""

BUNDLED = r"""
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[2]))
from codila_cli.config import load_config
from codila_cli.engine import Engine
from codila_cli.resolve import resolve_gen
scheme, n = sys.argv[1], int(sys.argv[3])
prompts = [json.loads(l)["prompt"] for l in open(sys.argv[4])][:n]
req = resolve_gen({}, user=load_config(), dlm="bundled-dlm", ar="bundled-ar")
eng = Engine.load(dlm=req.dlm, ar=req.ar, dtype="bfloat16", settings=req, threads=int(sys.argv[2]),
                  quantize=scheme, quantize_ar=scheme)
out, tokens, secs = [], 0, 0.0
for p in prompts:
    t = time.perf_counter()
    r = eng.generate(p, decoder=req.decoder, config=req.config, seed=0)
    secs += time.perf_counter() - t
    tokens += r.metrics["tokens"]
    out.append({"text": r.completion, "valid": r.syntax.valid})
print(json.dumps({"rows": out, "tok_s": tokens / secs, "decoder": req.decoder}))
"""


def _child(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _save(out: Path, config: dict, shapes: dict[str, tuple[int, ...]], head: str, tokenizer_from: Path) -> None:
    """Random bf16 weights (std 0.02, norms 1, the head ``HEAD_STD / sqrt(hidden)``) in the released layout,
    written a tensor group at a time through safetensors (one file; shards are not needed at these sizes)."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    state = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            state[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            std = HEAD_STD / math.sqrt(shape[1]) if name == head else 0.02
            state[name] = torch.empty(shape).normal_(0.0, std, generator=g).to(torch.bfloat16)
    save_file(state, str(out / ".partial"), metadata={"format": "pt"})
    (out / ".partial").rename(out / "model.safetensors")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_from / name, out / name)
    (out / "config.json").write_text(json.dumps(config))


def ensure(folder: Path, which: str) -> tuple[Path, str]:
    """The checkpoint ``which`` under ``folder`` (built once), and the decoder gen runs it with."""
    if which == "sdar-tiny":  # the tests' tiny SDAR checkpoint: a dry run of this benchmark (or a GPU script) in seconds
        return FIXTURES / "sdar" / "checkpoints" / "sdar-tiny-a", "block"
    path = folder / which
    decoder = {"sdar-1.7b": "block", "sdar-8b-4l": "block", "dream-7b-4l": "threshold", "llada-8b-4l": "llada"}[which]
    if (path / "config.json").is_file():
        return path, decoder
    if which in ("sdar-1.7b", "sdar-8b-4l"):
        src = FIXTURES / "sdar" / "checkpoints" / "sdar-tiny-a"
        cfg = json.loads((src / "config.json").read_text())
        # SDAR-1.7B (Qwen3-1.7B's shape: tied head) whole; SDAR-8B (Qwen3-8B's: its own head) with 4 of 36 layers
        d, m, heads, hd, n, tied = (2048, 6144, 16, 128, 28, True) if which == "sdar-1.7b" else \
            (4096, 12288, 32, 128, 4, False)
        vocab = cfg["vocab_size"]
        cfg.update(hidden_size=d, num_attention_heads=heads, num_key_value_heads=8, head_dim=hd, intermediate_size=m,
                   num_hidden_layers=n, tie_word_embeddings=tied, dtype="bfloat16")
        shapes = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,),
                  **({} if tied else {"lm_head.weight": (vocab, d)})}
        for i in range(n):
            p = f"model.layers.{i}."
            shapes.update({p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                           p + "self_attn.q_proj.weight": (heads * hd, d), p + "self_attn.k_proj.weight": (8 * hd, d),
                           p + "self_attn.v_proj.weight": (8 * hd, d), p + "self_attn.o_proj.weight": (d, heads * hd),
                           p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                           p + "mlp.gate_proj.weight": (m, d), p + "mlp.up_proj.weight": (m, d),
                           p + "mlp.down_proj.weight": (d, m)})
        # tied: the embedding is the head (its spread is the head's; the first norm rescales the input)
        _save(path, cfg, shapes, "model.embed_tokens.weight" if tied else "lm_head.weight", src)
    elif which == "llada-8b-4l":
        src = FIXTURES / "llada" / "checkpoints" / "llada-tiny-a"
        cfg = json.loads((src / "config.json").read_text())
        d, m, n, vocab = 4096, 12288, 4, cfg["embedding_size"]
        cfg.update(d_model=d, n_heads=32, n_kv_heads=32, n_layers=n, mlp_hidden_size=m, dtype="bfloat16")
        shapes = {"model.transformer.wte.weight": (vocab, d), "model.transformer.ln_f.weight": (d,),
                  "model.transformer.ff_out.weight": (vocab, d)}
        for i in range(n):
            p = f"model.transformer.blocks.{i}."
            shapes.update({p + "attn_norm.weight": (d,), p + "ff_norm.weight": (d,), p + "ff_proj.weight": (m, d),
                           p + "up_proj.weight": (m, d), p + "ff_out.weight": (d, m),
                           **{p + f"{q}.weight": (d, d) for q in ("q_proj", "k_proj", "v_proj", "attn_out")}})
        _save(path, cfg, shapes, "model.transformer.ff_out.weight", src)
    else:
        from codila_cli.train.shaped import PRESETS, Shape, build_shaped

        w = PRESETS["dream-coder-7b"]
        dlm = Shape(hidden=w.hidden, intermediate=w.intermediate, layers=4, heads=w.heads, kv_heads=w.kv_heads,
                    head_dim=w.head_dim, extra_rows=w.extra_rows, tied=False, dream=True)
        ar = Shape(hidden=32, intermediate=64, layers=1, heads=4, kv_heads=2, head_dim=8, extra_rows=293, tied=True,
                   dream=False)
        build_shaped(folder / "dream-build", dlm=dlm, ar=ar, ordinary=2000)
        _respread(folder / "dream-build" / "dlm", w.hidden)
        (folder / "dream-build" / "dlm").rename(path)
    return path, decoder


def _respread(path: Path, hidden: int) -> None:
    """The Dream build's head redrawn with the benchmark's spread (train/shaped.py draws std 0.02)."""
    import torch
    from safetensors.torch import load_file, save_file

    state = load_file(str(path / "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    state["lm_head.weight"] = torch.empty(state["lm_head.weight"].shape).normal_(
        0.0, HEAD_STD / math.sqrt(hidden), generator=g).to(torch.bfloat16)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=Path("/tmp/codila-quant"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--models", default="sdar-1.7b,dream-7b-4l,llada-8b-4l")
    ap.add_argument("--prompts", type=int, default=60)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cuda: memory is the GPU's (torch's allocated bytes and their peak)")
    args = ap.parse_args()
    import torch

    where = (f"GPU: {torch.cuda.get_device_name()}" if args.device.startswith("cuda")
             else f"CPU: {_cpu()}, {args.threads} threads")
    mem = ("peak allocated MiB | allocated after decoding MiB | peak allocated MiB" if args.device.startswith("cuda")
           else "peak RSS MiB | RSS after decoding MiB | peak anon MiB")
    lines = [f"{where}, torch {torch.__version__}; {args.tokens} new tokens.", "",
             (f"| model | weights | {mem} | fit estimate MiB (÷ the larger of the last two) | load s | "
              "tok/s (× bf16) | tokens = bf16 | median top-1 p |"),
             "|---|---|---|---|---|---|---|---|---|---|"]
    for which in [m for m in args.models.split(",") if m]:
        path, decoder = ensure(args.dir, which)
        for f in path.glob("*.safetensors"):  # every scheme starts from a warm page cache (bf16 reads the
            with open(f, "rb") as fh:  # mapped file as it decodes: a cold cache made its first run 3.5× slower)
                while fh.read(1 << 24):
                    pass
        rows = {s: _child(CHILD, str(path), s, decoder, str(args.threads), str(args.tokens), args.device)
                for s in SCHEMES}
        ref = rows["none"]
        for s, r in rows.items():
            same = sum(a == b for a, b in zip(r["ids"], ref["ids"])) / max(1, len(ref["ids"]))
            lines.append(f"| {which} ({decoder}) | {'bf16' if s == 'none' else s} | {_mib(r['peak'])} | "
                         f"{_mib(r['rss'])} | {_mib(r['peak_anon'])} | {_mib(r['estimate'])} "
                         f"({r['estimate'] / max(r['rss'], r['peak_anon']):.2f}) | "
                         f"{r['load_s']:.1f} | {r['tok_s']:.2f} ({r['tok_s'] / ref['tok_s']:.2f}×) | {same:.0%} | "
                         f"{r['top1']:.2f} |")
        print("\n".join(lines[-3:]), flush=True)
    data = ROOT / "src" / "codila_cli" / "data" / "heldout_ext5_prompts.jsonl"
    bundled = {s: _child(BUNDLED, s, str(args.threads), str(args.prompts), str(data)) for s in SCHEMES} \
        if args.prompts > 0 else {}  # --prompts 0: the checkpoints' rows only
    ref = bundled["none"]["rows"] if bundled else []
    lines += [] if not bundled else ["", (f"Bundled pair ({bundled['none']['decoder']}, its default settings), {len(ref)} held-out "
                   "prompts (heldout_ext5), seed 0:"), "",
              "| weights (DLM and helper) | texts = bf16 | syntax-valid | tok/s (× bf16) |", "|---|---|---|---|"]
    for s, b in bundled.items():
        same = sum(a["text"] == r["text"] for a, r in zip(b["rows"], ref)) / len(ref)
        valid = sum(a["valid"] for a in b["rows"]) / len(ref)
        lines.append(f"| {'bf16' if s == 'none' else s} | {same:.0%} | {valid:.0%} | {b['tok_s']:.1f} "
                     f"({b['tok_s'] / bundled['none']['tok_s']:.2f}×) |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


if __name__ == "__main__":
    main()
