"""Random checkpoints with the real models' shapes and token layout (codila_cli/train/shaped.py)."""

from __future__ import annotations

import json

import pytest
import torch

from codila_cli.train.shaped import PRESETS, QWEN_SPECIALS, REAL_ORDINARY, Shape, build_shaped

DLM = Shape(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, extra_rows=421, tied=False,
            dream=True)
AR = Shape(hidden=32, intermediate=64, layers=2, heads=4, kv_heads=2, head_dim=8, extra_rows=293, tied=True,
           dream=False)


def _params(s: Shape, vocab: int) -> int:
    attn = s.hidden * s.head_dim * (2 * s.heads + 2 * s.kv_heads)
    return s.layers * (attn + 3 * s.hidden * s.intermediate) + vocab * s.hidden * (1 if s.tied else 2)


def test_presets_have_the_real_sizes():
    dlm, ar = PRESETS["dream-coder-7b"], PRESETS["qwen3-0.6b"]
    assert REAL_ORDINARY + dlm.extra_rows == 152064 and REAL_ORDINARY + ar.extra_rows == 151936
    assert 7.5e9 < _params(dlm, 152064) < 7.7e9  # Qwen2.5-7B: 7.6 B parameters
    assert 0.55e9 < _params(ar, 151936) < 0.65e9  # Qwen3-0.6B
    with pytest.raises(ValueError, match="multiple"):
        Shape(hidden=8, intermediate=8, layers=1, heads=3, kv_heads=2, head_dim=4, extra_rows=30, tied=True, dream=False)


@pytest.fixture(scope="module")
def shaped(tmp_path_factory):
    return build_shaped(tmp_path_factory.mktemp("shaped"), dlm=DLM, ar=AR, ordinary=500)


def test_shaped_pair_loads_with_the_real_token_layout_and_decodes(shaped, monkeypatch):
    """Both engines load the pair through the real loader, find the specials at the real offsets,
    keep the colliding ids out of the bridge, and decode the same tokens with the expected forwards."""
    from codila_cli.engine.generate import generate
    from codila_cli.engine.models import load_models
    from codila_cli.eval.settings import parse_setting

    cfg = json.loads((shaped["dlm"] / "config.json").read_text())
    assert cfg["model_type"] == "Dream" and cfg["vocab_size"] == 921 and not cfg["tie_word_embeddings"]
    n = len(QWEN_SPECIALS)
    outs = []
    for engine in ("native", "transformers"):
        monkeypatch.setenv("CODILA_ENGINE", engine)
        m = load_models(dlm=str(shaped["dlm"]), ar=str(shaped["ar"]), device="cpu", dtype="float32")
        d, a = m.dlm.specials, m.ar.specials
        assert (d.eos, d.end_of_turn, d.bos, d.mask, d.expand) == (500, 502, 500 + n, 501 + n, None)
        assert (a.eos, a.think_open, a.think_close, a.mask) == (500, 502 + n, 503 + n, None)
        assert (m.dlm.vocab_rows, m.ar.vocab_rows) == (921, 793)
        shared = set(m.bridge.shared_ids.tolist())
        # Dream's bos / mask collide with Qwen3's <tool_response> / </tool_response>: never bridged
        assert {d.bos, d.mask, a.think_open, a.think_close}.isdisjoint(shared) and 499 in shared
        # S is ids 0 … 521 as in the real pair: the helper's table is a view of its embedding, no copy
        from codila_cli.decoding.soft_ar import SoftBlockWriter

        assert m.bridge.contiguous and shared == set(range(500 + n))
        w = SoftBlockWriter(m.ar, m.bridge)
        assert w.table.data_ptr() == m.ar.embedding.data_ptr() and w.table.shape[0] == 500 + n
        out = []
        for spec in ("dream:K=1", "codila:B=4,W=1", "codila:B=4,W=1,cache=dual,cb=2"):
            st = parse_setting(spec, max_new_tokens=8)
            r = generate(m, "def f(x): return x", decoder=st.decoder, config=st.config, seed=0)
            assert r.metrics["tokens"] == 8
            assert r.metrics["dlm_forwards"] == (8 if spec == "dream:K=1" else 2)
            out.append(r.completion)
        outs.append(out)
    assert outs[0] == outs[1]


def test_weights_are_random_but_seeded(tmp_path):
    from safetensors.torch import load_file

    a = build_shaped(tmp_path / "a", dlm=DLM, ar=AR, ordinary=50, seed=1)
    b = build_shaped(tmp_path / "b", dlm=DLM, ar=AR, ordinary=50, seed=1)
    c = build_shaped(tmp_path / "c", dlm=DLM, ar=AR, ordinary=50, seed=2)
    wa, wb, wc = (load_file(p["dlm"] / "model.safetensors") for p in (a, b, c))
    key = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(wa[key], wb[key]) and not torch.equal(wa[key], wc[key])
    assert wa[key].dtype == torch.bfloat16 and 0.015 < float(wa[key].float().std()) < 0.025
    assert "lm_head.weight" in wa and "lm_head.weight" not in load_file(a["ar"] / "model.safetensors")
    assert not list((tmp_path / "a" / "dlm").glob(".*partial"))


def test_perf_benchmark_runs_on_a_shaped_pair(shaped, tmp_path):
    """benchmarks/perf.py (what scripts/gpu_speed.sh runs at 7B) on the small shaped pair: forward counts,
    per-forward times and shares that add up."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "perf.py"), "--out", str(tmp_path), "--dlm",
                        str(shaped["dlm"]), "--ar", str(shaped["ar"]), "--prompts", "1", "--max-new-tokens", "8",
                        "--no-compile", "--no-startup", "--batch", "2", "--settings", "dream:K=1", "codila:B=4,W=1"],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {row["setting"]: row for row in json.loads((tmp_path / "perf.json").read_text())["rows"]}
    k1, co = rows["dream:K=1"], rows["codila:B=4,W=1"]
    assert (k1["tokens"], k1["dlm_forwards"], k1["ar_forwards"]) == (8, 8, 0)
    assert (co["tokens"], co["dlm_forwards"]) == (8, 2) and 2 <= co["ar_forwards"] <= 8
    for row in (k1, co):
        assert 0 < row["model_seconds"] <= row["wall_seconds"]
        assert abs(row["dlm_share"] + row["ar_share"] + row["sampler_overhead"] - 1) < 1e-9
        assert row["ms_per_dlm_forward"] > 0
    assert co["ms_per_ar_forward"] > 0 and 0 < co["soft_embedding_share"] < co["sampler_overhead"]
    assert "ms per DLM / AR forward" in (tmp_path / "perf.md").read_text()


def test_dreamon_layout_infills_with_both_decoders(tmp_path, monkeypatch):
    """DreamOn's <|expand|> sits where Qwen3 has <think> (ordinary + 24): the loader finds it, the bridge
    keeps it out, and `codila infill` runs with the plain DreamOn decoder and with CoDiLA blocks, leaving
    the text around the hole as it was."""
    from dataclasses import replace

    from typer.testing import CliRunner

    from codila_cli.cli import app
    from codila_cli.engine.models import load_models

    paths = build_shaped(tmp_path / "m", dlm=replace(DLM, infill=True), ar=AR, ordinary=500)
    n = len(QWEN_SPECIALS)
    m = load_models(dlm=str(paths["dlm"]), ar=str(paths["ar"]), device="cpu", dtype="float32")
    assert m.dlm.specials.expand == m.ar.specials.think_open == 502 + n
    assert m.dlm.specials.expand not in set(m.bridge.shared_ids.tolist())
    src = tmp_path / "a.py"
    src.write_text("def f(x):\n    return x\n")
    for decoder in ("dreamon", "codila"):
        r = CliRunner().invoke(app, ["infill", str(src), "--line", "2", "--dlm", str(paths["dlm"]), "--ar",
                                     str(paths["ar"]), "--decoder", decoder, "--max-middle-tokens", "8", "--seed", "0",
                                     "--json"])
        assert r.exit_code == 0, r.stderr
        doc = json.loads(r.stdout)
        assert doc["text"].startswith("def f(x):\n") and doc["text"].endswith("    return x\n")
    assert src.read_text() == "def f(x):\n    return x\n"
    with pytest.raises(ValueError, match="Dream"):
        replace(AR, infill=True)


def test_auto_dtype_on_cpu_keeps_large_bf16_checkpoints_in_bf16_per_model(shaped, tmp_path, monkeypatch):
    """`--dtype auto` on a CPU: bf16 for large checkpoints stored in bf16 (the real 7B files); a small
    one stored in bf16 (the bundled pair) is fp32, except a DLM on a CPU with AMX; chosen per model, and
    a bf16 DLM decodes with an fp32 helper."""
    import shutil

    from codila_cli.engine.generate import generate
    from codila_cli.engine.models import load_models
    from codila_cli.eval.settings import parse_setting
    from codila_cli.models import loading

    def dtypes(m):
        return m.dlm.model.get_input_embeddings().weight.dtype, m.ar.embedding.dtype if m.ar else None

    monkeypatch.setattr(loading, "cpu_multiplies_bf16", lambda: False)
    assert dtypes(load_models(dlm=str(shaped["dlm"]), ar=None, device="cpu", dtype="auto")) == (torch.float32, None)
    assert dtypes(load_models(dlm="bundled-dlm", ar="bundled-ar", device="cpu", dtype="auto")) == \
        (torch.float32, torch.float32)  # stored bf16, but small
    monkeypatch.setattr(loading, "cpu_multiplies_bf16", lambda: True)  # AMX: the DLM in bf16, the helper not
    assert dtypes(load_models(dlm="bundled-dlm", ar="bundled-ar", device="cpu", dtype="auto")) == \
        (torch.bfloat16, torch.float32)
    assert dtypes(load_models(dlm="bundled-dlm", ar="bundled-ar", device="cpu", dtype="float32")) == \
        (torch.float32, torch.float32)  # an explicit dtype is what it says
    monkeypatch.setattr(loading, "cpu_multiplies_bf16", lambda: False)
    monkeypatch.setattr(loading, "BF16_ON_CPU_FROM", 1)  # every shaped checkpoint counts as large
    m = load_models(dlm=str(shaped["dlm"]), ar=str(shaped["ar"]), device="cpu", dtype="auto")
    assert m.dlm.model.get_input_embeddings().weight.dtype == torch.bfloat16
    assert m.ar.embedding.dtype == torch.bfloat16
    ar32 = tmp_path / "ar32"
    shutil.copytree(shaped["ar"], ar32)
    cfg = json.loads((ar32 / "config.json").read_text())
    (ar32 / "config.json").write_text(json.dumps({**cfg, "dtype": "float32"}))
    mixed = load_models(dlm=str(shaped["dlm"]), ar=str(ar32), device="cpu", dtype="auto")
    assert mixed.dlm.model.get_input_embeddings().weight.dtype == torch.bfloat16
    assert mixed.ar.embedding.dtype == torch.float32
    st = parse_setting("codila:B=4,W=1,ctx=8,rp=1.3", max_new_tokens=8)
    r = generate(mixed, "def f(x): return x", decoder=st.decoder, config=st.config, seed=0)
    assert (r.metrics["tokens"], r.metrics["dlm_forwards"]) == (8, 2)
    assert load_models(dlm=str(shaped["dlm"]), ar=None, device="cpu", dtype="float32").dlm.model \
        .get_input_embeddings().weight.dtype == torch.float32
