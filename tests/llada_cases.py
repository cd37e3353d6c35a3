"""Runs the LLaDA golden cases of tests/fixtures/llada/ through codila's LLaDA loader and sampler
(tests/test_llada.py runs this file in a subprocess pinned to torch's AVX2 kernels, as tests/parity_cases.py):

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python tests/llada_cases.py

prints one JSON object: case id -> [ids, forwards], plus ``_sha`` (each case's first-forward logits hash).
"""

from __future__ import annotations

import hashlib
import json
from functools import partial

import torch
from golden_cases import FIXTURES, cases, fixture_dlm, target  # noqa: F401 -- target: the tests import it here

LLADA_DIR = FIXTURES / "llada"
CASES = cases("llada", "llada_cases.jsonl")
FAST = cases("llada", "fastdllm_llada_cases.jsonl")
dlm = partial(fixture_dlm, "llada")


def run(case: dict) -> tuple[list[int], int]:
    """codila's decode_llada with the official generate()'s settings, mapped 1:1 (gen_length →
    max_new_tokens), early stop off (the official loop decodes the whole canvas)."""
    from codila_cli.decoding.config import SamplingConfig
    from codila_cli.decoding.llada import LladaConfig, decode_llada

    s = case["settings"]
    cfg = LladaConfig(max_new_tokens=s["gen_length"], steps=s["steps"], block_length=s["block_length"],
                      remasking=s["remasking"], cfg_scale=s["cfg_scale"],
                      sampling=SamplingConfig(temperature=s["temperature"]), early_stop=False)
    ids = case["input_ids"][0]
    torch.manual_seed(case["seed"])
    res = decode_llada(dlm(case["checkpoint"], case["dtype"]), ids, config=cfg,
                       generator=torch.Generator().manual_seed(case["seed"]))
    return ids + res.canvas, res.dlm_forwards


def run_fast(case: dict) -> tuple[list[int], int]:
    """codila's threshold decoder, Fast-dLLM convention, on a Fast-dLLM LLaDA golden (decoding/llada_fast.py)."""
    from codila_cli.decoding.config import SamplingConfig, ThresholdConfig
    from codila_cli.decoding.threshold import decode_threshold

    s = case["settings"]
    cfg = ThresholdConfig(max_new_tokens=s["gen_length"], block_length=s["block_length"], threshold=s["threshold"],
                          sampling=SamplingConfig(temperature=s["temperature"]), cache=s["cache"],
                          convention="fast-dllm", early_stop=False)
    ids = case["input_ids"][0]
    torch.manual_seed(case["seed"])
    res = decode_threshold(dlm(case["checkpoint"], case["dtype"]), ids, config=cfg,
                           generator=torch.Generator().manual_seed(case["seed"]))
    return ids + res.canvas, res.dlm_forwards


def first_forward_sha(case: dict) -> str:
    model = dlm(case["checkpoint"], case["dtype"])
    ids = case["input_ids"][0]
    raw = model.raw_logits(torch.tensor([ids + [model.specials.mask] * case["settings"]["gen_length"]])).contiguous()
    raw = raw.view(torch.int16) if raw.dtype == torch.bfloat16 else raw
    return hashlib.sha256(raw.numpy().astype(raw.numpy().dtype.newbyteorder("<")).tobytes()).hexdigest()


def gemm_fingerprint() -> str:
    """SHA-256 of plain fp32 ``F.linear`` products and attentions (no codila code) of the two checkpoints'
    shapes at every canvas length the cases use, on fixed inputs drawn exactly: it depends only on how this
    machine's fp32 GEMM and attention round (tests/parity_cases.py explains why a CI machine may differ),
    so the tests know whether the fp32 hashes can hold here."""
    import torch.nn.functional as F

    g, h = torch.Generator().manual_seed(0), hashlib.sha256()

    def draw(*shape: int, scale: int) -> torch.Tensor:
        return torch.randint(-999, 1000, shape, generator=g).float() / scale

    for name in sorted({c["checkpoint"] for c in CASES}):
        cfg = json.loads((LLADA_DIR / "checkpoints" / name / "config.json").read_text())
        d, inter, vocab, heads, kv = cfg["d_model"], cfg["mlp_hidden_size"], cfg["embedding_size"], cfg["n_heads"], cfg["n_kv_heads"]
        lengths = sorted({len(c["input_ids"][0]) + c["settings"]["gen_length"] for c in CASES if c["checkpoint"] == name})
        for fan_in, fan_out in [(d, d + 2 * kv * d // heads), (d, d), (d, 2 * inter), (inter, d), (d, vocab)]:
            w = draw(fan_out, fan_in, scale=991)
            for m in lengths:
                h.update(F.linear(draw(1, m, fan_in, scale=997), w).numpy().astype("<f4").tobytes())
        for m in lengths:
            q, k, v = (draw(1, n, m, d // heads, scale=s) for n, s in ((heads, 997), (kv, 991), (kv, 983)))
            h.update(F.scaled_dot_product_attention(q, k, v, enable_gqa=True).numpy().astype("<f4").tobytes())
    return h.hexdigest()


if __name__ == "__main__":
    torch.set_num_threads(1)
    out: dict = {"_sha": {c["id"]: first_forward_sha(c) for c in CASES}, "_gemm": gemm_fingerprint()}
    for case in CASES:
        out[case["id"]] = run(case)
    for case in FAST:
        out[case["id"]] = run_fast(case)
    print(json.dumps(out))
