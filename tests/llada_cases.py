"""Runs the LLaDA golden cases of tests/fixtures/llada/ through codila's LLaDA loader and sampler
(tests/test_llada.py runs this file in a subprocess pinned to torch's AVX2 kernels, as tests/parity_cases.py):

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python tests/llada_cases.py

prints one JSON object: case id -> [ids, forwards], plus ``_sha`` (each case's first-forward logits hash).
"""

from __future__ import annotations

import hashlib
import json
from functools import cache
from pathlib import Path

import torch

LLADA_DIR = Path(__file__).resolve().parent / "fixtures" / "llada"
CASES = [json.loads(line) for line in (LLADA_DIR / "llada_cases.jsonl").read_text().splitlines()]


@cache
def dlm(checkpoint: str, dtype: str):
    from codila_cli.models.families import load_dlm

    return load_dlm(LLADA_DIR / "checkpoints" / checkpoint, name=checkpoint, device=torch.device("cpu"),
                    dtype=getattr(torch, dtype))


def target(case: dict) -> tuple[list[int], int]:
    if case["mask_ban_changes_output"]:
        return case["expected_ids_mask_banned"][0], case["forwards_mask_banned"]
    return case["expected_ids"][0], case["forwards"]


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


def first_forward_sha(case: dict) -> str:
    model = dlm(case["checkpoint"], case["dtype"])
    ids = case["input_ids"][0]
    raw = model.raw_logits(torch.tensor([ids + [model.specials.mask] * case["settings"]["gen_length"]])).contiguous()
    raw = raw.view(torch.int16) if raw.dtype == torch.bfloat16 else raw
    return hashlib.sha256(raw.numpy().astype(raw.numpy().dtype.newbyteorder("<")).tobytes()).hexdigest()


if __name__ == "__main__":
    torch.set_num_threads(1)
    out: dict = {"_sha": {c["id"]: first_forward_sha(c) for c in CASES}}
    for case in CASES:
        out[case["id"]] = run(case)
    print(json.dumps(out))
