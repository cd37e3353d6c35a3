"""What the golden-case suites of the LLaDA and SDAR fixtures share (tests/test_llada.py, tests/test_sdar.py):
loading a fixture checkpoint, a case's target (the mask-banned official result where the ban changes it),
and running a case file in a subprocess pinned to torch's AVX2 kernels (tests/parity_cases.py says why)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import torch

FIXTURES = Path(__file__).resolve().parent / "fixtures"
AVX2 = platform.machine() in ("x86_64", "AMD64") and Path("/proc/cpuinfo").is_file() \
    and "avx2" in Path("/proc/cpuinfo").read_text(errors="ignore")
PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def cases(family: str, name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / family / name).read_text().splitlines()]


@cache
def fixture_dlm(family: str, checkpoint: str, dtype: str):
    from codila_cli.models.families import load_dlm

    return load_dlm(FIXTURES / family / "checkpoints" / checkpoint, name=checkpoint, device=torch.device("cpu"),
                    dtype=getattr(torch, dtype))


def target(case: dict) -> tuple[list[int], int]:
    if case["mask_ban_changes_output"]:
        return case["expected_ids_mask_banned"][0], case["forwards_mask_banned"]
    return case["expected_ids"][0], case["forwards"]


def run_pinned(script: str) -> dict:
    """The JSON a case script (tests/<script>) prints, run with one thread under the AVX2 variables."""
    r = subprocess.run([sys.executable, str(Path(__file__).parent / script)], capture_output=True, text=True,
                       env={**os.environ, **PINNED}, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def pinned_results(script: str) -> Any:
    """A module-scoped fixture named ``results``: the JSON of ``run_pinned(script)``, run once per module."""
    import pytest

    def results() -> dict:
        return run_pinned(script)

    return pytest.fixture(scope="module", name="results")(results)


def assert_block_matches(hf: Any, dlm: Any, *, vocab: int) -> tuple[Any, list]:
    """A block read against the cache (``dlm.prefill`` of two blocks of 4, then ``block_logits`` of the third)
    equals the same block in one forward of transformers' ``hf`` under the block-causal mask, to 1e-5 over the
    first ``vocab`` ids; returns the ids [1, 12] and the prefilled cache."""
    x = torch.randint(0, 512, (1, 12), generator=torch.Generator().manual_seed(0))
    blocks = torch.arange(12) // 4
    mask = (blocks[None, :] <= blocks[:, None])[None, None]
    with torch.no_grad():
        want = hf.float().eval()(input_ids=x, attention_mask=mask).logits
    past = dlm.prefill(x[:, :8], 4)
    got = dlm.block_logits(x[:, 8:12], 8, past)
    assert torch.allclose(got[..., :vocab], want[:, 8:12, :vocab], atol=1e-5)
    return x, past
