"""Runs the Stable-DiffCoder golden cases of tests/fixtures/stable_diffcoder/ through codila's loader and
block sampler (tests/test_stable_diffcoder.py runs this file in a subprocess pinned to torch's AVX2 kernels,
as tests/parity_cases.py):

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 python tests/stable_diffcoder_cases.py

prints one JSON object: case id -> [ids, forwards].
"""

from __future__ import annotations

import json
from functools import partial

import torch
from golden_cases import FIXTURES, cases, fixture_dlm, target  # noqa: F401 -- target: the tests import it here

SDC_DIR = FIXTURES / "stable_diffcoder"
CASES = cases("stable_diffcoder", "stable_diffcoder_cases.jsonl")
dlm = partial(fixture_dlm, "stable_diffcoder")


def config(s: dict):
    """codila's BlockConfig for the official generate_block's keyword arguments: ``steps`` over the whole
    canvas becomes steps per block; ``threshold`` set is --remasking dynamic; ``eos_id`` set is early stop."""
    from codila_cli.decoding.block import BlockConfig
    from codila_cli.decoding.config import SamplingConfig

    blocks = s["gen_length"] // s["block_length"]
    remasking = "random" if s["remasking"] == "random" else "dynamic" if s["threshold"] is not None else "low_confidence"
    return BlockConfig(max_new_tokens=s["gen_length"], block_length=s["block_length"], steps=s["steps"] // blocks,
                       remasking=remasking, threshold=s["threshold"] if s["threshold"] is not None else 0.9,
                       sampling=SamplingConfig(temperature=s["temperature"]), early_stop=s["eos_id"] is not None)


def run(case: dict) -> tuple[list[int], int]:
    from codila_cli.decoding.block import decode_block

    ids = case["input_ids"][0]
    torch.manual_seed(case["seed"])
    res = decode_block(dlm(case["checkpoint"], case["dtype"]), ids, config=config(case["settings"]),
                       generator=torch.Generator().manual_seed(case["seed"]))
    return ids + res.canvas, res.dlm_forwards


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(json.dumps({case["id"]: run(case) for case in CASES}))
