"""LLaDA (issue 51): the loader reads the released layout through models/llada.py onto models/native.py,
and decoding/llada.py reproduces the official ``generate`` token for token (tests/fixtures/llada/)."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from llada_cases import CASES, LLADA_DIR, target

from codila_cli.errors import ModelLoadError
from codila_cli.models.families import load_dlm

AVX2 = platform.machine() in ("x86_64", "AMD64") and Path("/proc/cpuinfo").is_file() \
    and "avx2" in Path("/proc/cpuinfo").read_text(errors="ignore")
PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
needs_avx2 = pytest.mark.skipif(not AVX2, reason="the goldens are pinned to torch's AVX2 CPU kernels")


@pytest.fixture(scope="module")
def results() -> dict:
    r = subprocess.run([sys.executable, str(Path(__file__).parent / "llada_cases.py")], capture_output=True,
                       text=True, env={**os.environ, **PINNED}, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


@needs_avx2
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['id']}-{c['group']}-{c['dtype']}")
def test_llada_generate_matches_the_official_code(case, results):
    """The same ids and the same number of forwards as the official generate() (fixtures README)."""
    ids, forwards = results[case["id"]]
    want, want_forwards = target(case)
    assert ids == want
    assert forwards == want_forwards


@needs_avx2
def test_the_first_forward_is_the_official_one_bit_for_bit(results):
    """codila's native network gives the official LLaDAModelLM's logits bit for bit, fp32 and bf16 (the
    bf16 forward rotates q and k in fp32, as LLaDA's rope_full_precision does)."""
    assert results["_sha"] == {c["id"]: c["first_forward_logits_sha256"] for c in CASES}


def test_the_goldens_exercise_what_they_claim():
    groups = {c["group"] for c in CASES}
    assert groups == {"greedy_low_confidence", "random_remasking", "temperature", "cfg", "odd_sizes", "bf16"}
    assert {c["settings"]["remasking"] for c in CASES} == {"low_confidence", "random"}
    assert any(c["settings"]["cfg_scale"] > 0 and c["settings"]["temperature"] > 0 for c in CASES)
    assert {c["settings"]["block_length"] < c["settings"]["gen_length"] for c in CASES} == {True, False}
    assert {c["dtype"] for c in CASES} == {"float32", "bfloat16"}
    kv = {name: json.loads((LLADA_DIR / "checkpoints" / name / "config.json").read_text())["n_kv_heads"]
          for name in ("llada-tiny-a", "llada-tiny-b")}
    assert kv == {"llada-tiny-a": 4, "llada-tiny-b": 2}  # plain and grouped-query attention


def _llada(name: str = "llada-tiny-a"):
    return load_dlm(LLADA_DIR / "checkpoints" / name, name=name, device=torch.device("cpu"), dtype=torch.float32)


def test_llada_logits_are_not_shifted_and_the_mask_is_never_chosen():
    dlm = _llada()
    x = torch.tensor([[513, 300, 301, 517, 517, 517]])
    raw = dlm.raw_logits(x)
    got = dlm.logits(x)
    assert torch.equal(got[..., :517], raw[..., :517])  # row i is token i: no shift, unlike Dream
    assert bool((got[..., 517] == torch.finfo(torch.float32).min).all())
    assert torch.allclose(dlm.logits(x, rows=(3, 5)), got[:, 3:5], atol=1e-5)  # (another GEMM shape: last bits)
    assert dlm.specials.mask == 517 and dlm.specials.eos == 512 and dlm.specials.end_of_turn == 516
    assert dlm.context_length == 4096  # max_sequence_length, LLaDA's name for it


def test_llada_checkpoints_that_codila_cannot_run_are_refused_clearly(tmp_path):
    src = LLADA_DIR / "checkpoints" / "llada-tiny-a"
    for key, value, words in [("block_type", "sequential", "block_type 'sequential'"),
                              ("activation_type", "gelu", "activation 'gelu'"),
                              ("include_bias", True, "biases on every linear layer")]:
        dst = tmp_path / key
        shutil.copytree(src, dst)
        cfg = json.loads((dst / "config.json").read_text())
        cfg[key] = value
        (dst / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ModelLoadError, match=words):
            load_dlm(dst, name=key, device=torch.device("cpu"), dtype=torch.float32)
    # a tensor under a name LLaDA does not use: named by the strict key check
    from safetensors.torch import load_file, save_file

    dst = tmp_path / "renamed"
    shutil.copytree(src, dst)
    state = load_file(str(dst / "model.safetensors"))
    state["model.transformer.blocks.0.q_norm.weight"] = state["model.transformer.ln_f.weight"].clone()
    save_file(state, str(dst / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="unexpected"):
        load_dlm(dst, name="renamed", device=torch.device("cpu"), dtype=torch.float32)
