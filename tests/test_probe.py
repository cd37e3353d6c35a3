"""``--dtype auto`` on a CPU by measurement (models/probe.py): the probe's verdict decides a small bf16-stored
checkpoint's dtype, per role (a diffusion model's canvas rows, a helper's few rows), is cached per CPU model,
torch version, threads and shape, is reported by -v and doctor, and never overrides a named dtype."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch


@pytest.fixture
def probe_on(monkeypatch, tmp_path):
    monkeypatch.setenv("CODILA_DTYPE_PROBE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    from codila_cli.models import probe

    return probe


def _timer(monkeypatch, probe, bf16_wins_from_rows: int):
    """Fake timings: bf16 takes half fp32's time at ``bf16_wins_from_rows`` rows or more, twice below."""
    calls = []

    def fake(hidden, intermediate, rows, dtype):
        calls.append((rows, dtype))
        if dtype == torch.float32:
            return 1.0
        return 0.5 if rows >= bf16_wins_from_rows else 2.0

    monkeypatch.setattr(probe, "time_product", fake)
    return calls


def _dtypes(models):
    return models.dlm.ckpt.dtype, models.ar.ckpt.dtype


def test_the_verdict_decides_per_role_and_is_cached(probe_on, monkeypatch):
    """bf16 faster over a canvas's rows but slower at a helper's few: the bundled DLM (stored in bf16) runs
    in bf16, its helper in fp32; the verdicts are cached under the CPU, torch version, threads, role and
    shape, so the next load times nothing; a named dtype is never probed."""
    from codila_cli.engine.models import load_models

    calls = _timer(monkeypatch, probe_on, bf16_wins_from_rows=64)
    models = load_models(dlm="bundled-dlm", ar="bundled-ar", device="cpu")
    assert _dtypes(models) == (torch.bfloat16, torch.float32)
    assert {r for r, _ in calls} == {64, 256, 1, 8}
    assert "probe" in models.dlm.ckpt.dtype_note and "cached" not in models.dlm.ckpt.dtype_note
    cache = json.loads(probe_on.cache_file().read_text())
    assert len(cache) == 2 and all(probe_on.cpu_model() in k and torch.__version__ in k for k in cache)
    assert {v["bf16"] for v in cache.values()} == {True, False}

    def refuse(*args):
        raise AssertionError("timed again")

    monkeypatch.setattr(probe_on, "time_product", refuse)
    again = load_models(dlm="bundled-dlm", ar="bundled-ar", device="cpu")
    assert _dtypes(again) == (torch.bfloat16, torch.float32) and "cached" in again.dlm.ckpt.dtype_note
    named = load_models(dlm="bundled-dlm", ar="bundled-ar", device="cpu", dtype="float32")
    assert _dtypes(named) == (torch.float32, torch.float32) and named.dlm.ckpt.dtype_note == ""


def test_where_bf16_is_slower_auto_keeps_fp32(probe_on, monkeypatch):
    from codila_cli.engine.models import load_models

    _timer(monkeypatch, probe_on, bf16_wins_from_rows=10**9)
    assert _dtypes(load_models(dlm="bundled-dlm", ar="bundled-ar", device="cpu")) == (torch.float32, torch.float32)


def test_a_checkpoint_stored_in_fp32_is_not_probed(probe_on, monkeypatch, tiny):
    """The tiny checkpoints are stored in fp32: auto keeps them exact, without timing anything."""
    from codila_cli.engine.models import load_models

    calls = _timer(monkeypatch, probe_on, bf16_wins_from_rows=1)
    m = load_models(dlm=str(tiny["dlm"]), ar=None, device="cpu")
    assert m.dlm.ckpt.dtype == torch.float32 and calls == [] and m.dlm.ckpt.dtype_note == ""


def test_the_real_probe_runs_and_gen_v_and_doctor_report_it(tmp_path):
    """No fake: the probe times this CPU, gen -v names its verdict, the cache is written, and doctor
    reports the cached verdict for both models."""
    env = {**os.environ, "CODILA_DTYPE_PROBE": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = subprocess.run([sys.executable, "-m", "codila_cli", "gen", "-v", "--no-stream", "--max-new-tokens", "8",
                        "--seed", "0", "def f(x):"], capture_output=True, text=True, timeout=300, env=env, check=False)
    assert r.returncode == 0, r.stderr
    settings = next(line for line in r.stderr.splitlines() if line.startswith("settings:"))
    import re

    ran = re.findall(r"\(cpu, (\w+); auto: (bf16|fp32): bf16 ran [\d.]+× fp32's speed on this CPU \(probe\)\)", settings)
    assert len(ran) == 2 and all((dt, word) in (("bfloat16", "bf16"), ("float32", "fp32")) for dt, word in ran), settings
    cache = json.loads((tmp_path / "cache" / "codila" / "dtype-probe.json").read_text())
    assert len(cache) == 2 and all(v["fp32_s"] > 0 and v["bf16_s"] > 0 for v in cache.values())
    r = subprocess.run([sys.executable, "-m", "codila_cli", "doctor", "--json"], capture_output=True, text=True,
                       timeout=300, env=env, check=False)
    checks = {c["name"]: c["value"] for c in json.loads(r.stdout)["checks"]}
    assert "(probe, cached)" in checks["weights dlm"] and "(probe, cached)" in checks["weights ar"]


def test_quantize_auto_takes_the_fastest_scheme_that_fits(probe_on, monkeypatch):
    """--quantize auto / --quantize-ar auto: the probe's fastest weights per role (here bf16 for the DLM's
    canvas rows, int4 for the helper's few rows), but only among the schemes that fit the memory: under a
    limit below the bf16 load, the DLM takes int8 (the fastest of those that fit), and the note says so."""
    from codila_cli.engine.models import load_models, plan_load, sized
    from codila_cli.models.cache import resolve_local_dir
    from codila_cli.models.fit import RUNTIME
    from codila_cli.models.registry import resolve_spec

    def fake(hidden, intermediate, rows, dtype, *, scheme="none"):
        if rows >= 64:  # a canvas: the codes' kernels are matrix-vector ones
            return {"none": 1.0, "int8": 1.5, "int4": 3.0}[scheme]
        return {"none": 1.0, "int8": 0.6, "int4": 0.4}[scheme]

    monkeypatch.setattr(probe_on, "time_product", fake)
    m = load_models(dlm="bundled-dlm", ar="bundled-ar", device="cpu", quantize="auto", quantize_ar="auto")
    assert (m.dlm.ckpt.quantize, m.ar.ckpt.quantize) == ("none", "int4")
    assert "quantize auto: int4" in m.ar.ckpt.dtype_note and "probe" in m.ar.ckpt.dtype_note
    dlm = resolve_local_dir(resolve_spec("bundled-dlm", kind="dlm"))

    def need(scheme):
        dt = plan_load(dlm, name="bundled-dlm", role="dlm", device="cpu", dtype="auto", quantize=scheme)[1]
        return sized([("bundled-dlm", dlm, dt, scheme)])[0][0].total

    monkeypatch.setenv("CODILA_MEMORY_LIMIT", str(RUNTIME + (need("none") + need("int8")) // 2))
    m = load_models(dlm="bundled-dlm", ar=None, device="cpu", quantize="auto")
    assert m.dlm.ckpt.quantize == "int8" and "quantize auto: int8" in m.dlm.ckpt.dtype_note
