"""Runs the SDAR golden cases of tests/fixtures/sdar/ through codila's block-diffusion loader and sampler
(tests/test_sdar.py runs this file in a subprocess pinned to torch's AVX2 kernels, as tests/parity_cases.py):

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python tests/sdar_cases.py

prints one JSON object: case id -> [ids, forwards].
"""

from __future__ import annotations

import json
from functools import partial

import torch
from golden_cases import FIXTURES, cases, fixture_dlm, target  # noqa: F401 -- target: the tests import it here

SDAR_DIR = FIXTURES / "sdar"
CASES = cases("sdar", "sdar_cases.jsonl")
dlm = partial(fixture_dlm, "sdar")
REMASKING = {"low_confidence_static": "low_confidence", "low_confidence_dynamic": "dynamic", "sequential": "sequential"}


def run(case: dict) -> tuple[list[int], int]:
    """codila's decode_block with the official block_diffusion_generate's settings, mapped 1:1 (top_k 0 and
    top_p 1.0 are no filter; stopping_criteria_idx None is early stop off)."""
    from codila_cli.decoding.block import BlockConfig, decode_block
    from codila_cli.decoding.config import SamplingConfig

    s = case["settings"]
    cfg = BlockConfig(max_new_tokens=s["gen_length"], block_length=s["block_length"], steps=s["denoising_steps"],
                      remasking=REMASKING[s["remasking_strategy"]], threshold=s["confidence_threshold"],
                      sampling=SamplingConfig(temperature=s["temperature"], top_k=s["top_k"] or None,
                                              top_p=s["top_p"] if s["top_p"] < 1 else None), early_stop=False)
    ids = case["input_ids"][0]
    torch.manual_seed(case["seed"])
    res = decode_block(dlm(case["checkpoint"], case["dtype"]), ids, config=cfg,
                       generator=torch.Generator().manual_seed(case["seed"]))
    return ids + res.canvas, res.dlm_forwards


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(json.dumps({case["id"]: run(case) for case in CASES}))
