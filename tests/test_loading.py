"""Checkpoint resolution and loading through the code users run, on tiny HF-layout checkpoints."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from codila_cli.errors import IncompatibleModelsError, ModelLoadError, ModelNotFoundError, UsageError
from codila_cli.models.cache import resolve_local_dir
from codila_cli.models.dream import shift_logits
from codila_cli.models.families import load_dlm
from codila_cli.models.registry import resolve_spec

CPU = torch.device("cpu")


def test_attention_is_bidirectional(tiny_models):
    dlm = tiny_models.dlm
    x = torch.arange(10, 30).unsqueeze(0)
    y = x.clone()
    y[0, -1] = 50
    a, b = dlm.logits(x), dlm.logits(y)
    d = a[0, 2] - b[0, 2]  # the mask column is the fp32 minimum in both (difference 0)
    assert d.abs().max() > 1e-4  # a late token changes an early position


def test_shift_makes_last_prompt_position_predict_first_slot(tiny_models):
    dlm = tiny_models.dlm
    prompt_len = 7
    x = torch.cat([torch.arange(10, 17), torch.full((5,), dlm.specials.mask)]).unsqueeze(0)
    raw = dlm.raw_logits(x)
    shifted = dlm.logits(x)
    assert torch.allclose(shifted[0, prompt_len], dlm.emittable(raw)[0, prompt_len - 1])
    assert bool((torch.softmax(shifted, -1)[..., dlm.specials.mask] == 0).all())  # the mask is never on offer
    assert torch.equal(shift_logits(raw)[:, 0], raw[:, 0])


def test_left_padding_equals_unpadded(tiny_models):
    dlm = tiny_models.dlm
    x = torch.arange(10, 22).unsqueeze(0)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x], 1)
    mask = torch.cat([torch.zeros(1, 3), torch.ones(1, 12)], 1).long()
    a = dlm.logits(x)
    b = dlm.logits(padded, attention_mask=mask)
    assert torch.allclose(a[0, 1:], b[0, 4:], atol=1e-5)


def test_special_tokens_come_from_tokenizer(tiny_models):
    sp = tiny_models.dlm.specials
    tok = tiny_models.dlm.tokenizer
    assert tok.convert_ids_to_tokens(sp.mask) == "<|mask|>"
    assert tok.convert_ids_to_tokens(sp.eos) == "<|endoftext|>"
    assert tok.convert_ids_to_tokens(sp.expand) == "<|expand|>"
    assert sp.pad == sp.eos


def test_hub_cache_layout_resolves(tiny, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tiny["hub"]))
    path = resolve_local_dir(resolve_spec("codila/tiny-dream", kind="dlm"))
    assert (path / "config.json").is_file() and "snapshots" in str(path)


def test_missing_model_names_cache_and_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ModelNotFoundError) as exc:
        resolve_local_dir(resolve_spec("dream-coder", kind="dlm"))
    assert str(tmp_path / "empty-cache") in exc.value.message
    assert exc.value.hint == "codila pull dream-coder"
    assert exc.value.exit_code == 3


def test_missing_model_fails_before_torch_import(tmp_path):
    code = ("import sys\nfrom codila_cli.models.cache import resolve_local_dir\n"
            "from codila_cli.models.registry import resolve_spec\n"
            "try:\n    resolve_local_dir(resolve_spec('dream-coder', kind='dlm'))\n"
            "except Exception as e:\n    print(type(e).__name__)\n"
            "print('torch' in sys.modules, 'transformers' in sys.modules)\n")
    env = {"HF_HUB_CACHE": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.split() == ["ModelNotFoundError", "False", "False"], out.stderr


def _fake_hub(tiny, cache, repo: str, rev: str, *, main: bool = True):
    root = cache / ("models--" + repo.replace("/", "--"))
    shutil.copytree(tiny["dlm"], root / "snapshots" / rev)
    if main:
        (root / "refs").mkdir(parents=True, exist_ok=True)
        (root / "refs" / "main").write_text(rev)
    return root


def test_aliases_are_pinned_to_a_revision_and_load_exactly_it(tiny, tmp_path, monkeypatch):
    from codila_cli.models.registry import ALIASES, RECORDED_AT_PULL

    assert all(s.revision and len(s.revision) == 40 for s in ALIASES.values() if s.name not in RECORDED_AT_PULL)
    assert all(ALIASES[n].revision is None for n in RECORDED_AT_PULL)
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    pinned = ALIASES["dream-coder"].revision
    # the cache's main points at a newer snapshot: the alias still loads the pinned one
    _fake_hub(tiny, cache, "Dream-org/Dream-Coder-v0-Instruct-7B", "f" * 40)
    with pytest.raises(ModelNotFoundError) as exc:
        resolve_local_dir(resolve_spec("dream-coder", kind="dlm"))
    assert "codila pull dream-coder" in exc.value.hint and "dream-coder@main" in exc.value.hint
    assert resolve_local_dir(resolve_spec("dream-coder@main", kind="dlm")).name == "f" * 40
    _fake_hub(tiny, cache, "Dream-org/Dream-Coder-v0-Instruct-7B", pinned, main=False)
    assert resolve_local_dir(resolve_spec("dream-coder", kind="dlm")).name == pinned
    with pytest.raises(UsageError):
        resolve_spec("dream-coder@", kind="dlm")


def test_unknown_alias_is_usage_error():
    with pytest.raises(UsageError):
        resolve_spec("dream-codr", kind="dlm")


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_pickle_only_checkpoint_refused(tiny, tmp_path):
    d = _copy(tiny["dlm"], tmp_path / "pkl")
    (d / "model.safetensors").unlink()
    torch.save({"x": torch.zeros(1)}, d / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="pickle"):
        resolve_local_dir(resolve_spec(str(d), kind="dlm"))


def test_truncated_safetensors_refused(tiny, tmp_path):
    d = _copy(tiny["dlm"], tmp_path / "trunc")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="damaged or truncated"):
        load_dlm(d, name="trunc", device=CPU, dtype=torch.float32)


def test_config_without_mask_token_refused(tiny, tmp_path):
    d = _copy(tiny["dlm"], tmp_path / "nomask")
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("mask_token_id")
    (d / "config.json").write_text(json.dumps(cfg))
    tcfg = json.loads((d / "tokenizer_config.json").read_text())
    tcfg.pop("mask_token")
    (d / "tokenizer_config.json").write_text(json.dumps(tcfg))
    tok = json.loads((d / "tokenizer.json").read_text())
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] != "<|mask|>"]
    tok["model"]["vocab"].pop("<|mask|>")
    (d / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ModelLoadError, match="no mask token"):
        load_dlm(d, name="nomask", device=CPU, dtype=torch.float32)


def test_remote_code_checkpoint_never_executed(tiny, tmp_path):
    d = _copy(tiny["ar"], tmp_path / "remote")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "evil_remote"
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
    (d / "config.json").write_text(json.dumps(cfg))
    marker = tmp_path / "executed"
    (d / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    from codila_cli.models.ar import load_ar

    with pytest.raises(ModelLoadError, match="remote code"):
        load_ar(d, name="remote", device=CPU, dtype=torch.float32)
    assert not marker.exists()


def test_dream_given_as_ar_is_refused(tiny):
    from codila_cli.models.ar import load_ar

    with pytest.raises(ModelLoadError, match="not an autoregressive"):
        load_ar(tiny["dlm"], name="dlm", device=CPU, dtype=torch.float32)


def test_two_bpes_of_one_corpus_are_bridged_by_token_strings(tiny, tmp_path):
    """A helper whose ids mean other strings no longer refuses when its pieces are the DLM's under other
    ids: models/token_map.py pairs them by string (tests/test_token_map.py: refused when too few pair)."""
    from codila_cli.engine.models import load_models
    from codila_cli.models.token_map import TokenMap
    from codila_cli.train.tiny import build_tiny

    other = build_tiny(tmp_path / "other", vocab_size=300)  # a different BPE: ids mean other strings
    models = load_models(dlm=str(tiny["dlm"]), ar=str(other["ar"]), device="cpu", dtype="float32")
    assert isinstance(models.bridge, TokenMap) and 0.25 <= models.bridge.coverage < 1.0
    d, a = models.dlm.tokenizer, models.ar.tokenizer
    pairs = list(zip(models.bridge.dlm_ids.tolist(), models.bridge.ar_ids.tolist()))
    assert pairs and all(d.convert_ids_to_tokens(i) == a.convert_ids_to_tokens(j) for i, j in pairs[:50])
    assert IncompatibleModelsError  # what a helper sharing too few pieces raises


def test_bridge_cuts_control_tokens(tiny_models):
    b, sp = tiny_models.bridge, tiny_models.dlm.specials
    shared = set(b.shared_ids.tolist())
    assert sp.eos in shared
    for cut in (sp.mask, sp.expand, sp.bos, sp.think_open, sp.think_close):
        assert cut not in shared
    pi = torch.softmax(torch.randn(3, tiny_models.dlm.vocab_rows), -1)
    q = b.restrict(pi)
    assert torch.allclose(q.sum(-1), torch.ones(3))


@pytest.mark.parametrize("engine", ["native", "transformers"])
def test_loading_keeps_one_copy_of_the_weights(tiny, engine, monkeypatch):
    """The loaded tensors become the parameters (no staging copy, no fp32 detour): on transformers the
    embedding is the very tensor read from the file; the native network, whose fused matrices are copies,
    copies the rest off the mapped file once so the file is unmapped (its weights are held once, not
    twice: an SDAR-1.7B-shape bf16 load 4.6 → 2.8 GB, session 32), with the same values. The state dict is
    consumed, nothing is left on the meta device."""
    from codila_cli.engine.models import load_models
    from codila_cli.models import loading

    seen: dict = {}
    real = loading.load_state_dict

    def spy(*a, **k):
        state = real(*a, **k)
        seen["ptrs"] = {key: v.data_ptr() for key, v in state.items()}
        seen["embedding"] = state["model.embed_tokens.weight"].clone()
        seen["state"] = state
        return state

    monkeypatch.setattr(loading, "load_state_dict", spy)
    monkeypatch.setenv("CODILA_ENGINE", engine)
    m = load_models(dlm=str(tiny["dlm"]), ar=None, device="cpu", dtype="float32")
    net = m.dlm.model
    emb = net.get_input_embeddings().weight
    assert (emb.data_ptr() == seen["ptrs"]["model.embed_tokens.weight"]) == (engine == "transformers")
    assert torch.equal(emb, seen["embedding"])
    assert seen["state"] == {}
    assert not any(t.is_meta for t in [*net.parameters(), *net.buffers()])


def test_every_missing_model_is_named_in_one_error(tmp_path, monkeypatch):
    """Neither the DLM nor the helper cached: one exit 3 names both, each with its download command
    (issue 41), so the next try is not a surprise."""
    from typer.testing import CliRunner

    from codila_cli.cli import app

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = CliRunner().invoke(app, ["gen", "--dlm", "dream-coder", "--ar", "qwen3-0.6b", "def f():"])
    assert r.exit_code == 3, r.stderr
    err = r.stderr.splitlines()
    assert err[0].startswith("Error: 2 models are not in the Hugging Face cache") and "'dream-coder'" in err[0] \
        and "'qwen3-0.6b'" in err[0]
    assert err[1].startswith("Hint: codila pull dream-coder") and "; codila pull qwen3-0.6b" in err[1]
    one = CliRunner().invoke(app, ["gen", "--dlm", "dream-coder", "def f():"])  # one missing: named alone
    assert one.exit_code == 3 and one.stderr.startswith("Error: model 'dream-coder'")
