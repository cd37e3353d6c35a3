"""The torch-only engine (models/native.py) computes what transformers computes, on every call path."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from codila_cli.decoding.config import CodilaConfig, DreamConfig, ThresholdConfig

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def pairs(tiny):
    """(transformers, native) loads of the tiny Dream DLM and the tiny Qwen3 AR."""
    from codila_cli.models.ar import load_ar
    from codila_cli.models.families import load_dlm

    mp = pytest.MonkeyPatch()
    out = {}
    for engine in ("transformers", "native"):
        mp.setenv("CODILA_ENGINE", engine)
        out[engine] = (load_dlm(tiny["dlm"], name="d", device=CPU, dtype=torch.float32),
                       load_ar(tiny["ar"], name="a", device=CPU, dtype=torch.float32))
    mp.undo()
    assert type(out["native"][0].model).__name__ == "NativeLM"
    assert type(out["transformers"][0].model).__name__ == "Qwen2ForCausalLM"
    return out


def close(a, b):
    return torch.allclose(a.float(), b.float(), atol=1e-5, rtol=1e-4)


def test_dream_forward_padded_and_pair_mask_match(pairs):
    hf, nat = pairs["transformers"][0], pairs["native"][0]
    x = torch.randint(5, 300, (2, 12))
    assert close(hf.logits(x), nat.logits(x))
    keep = torch.ones(2, 12, dtype=torch.long)
    keep[0, :3] = 0
    assert close(hf.logits(x, attention_mask=keep)[0, 3:], nat.logits(x, attention_mask=keep)[0, 3:])
    pair = torch.rand(12, 12) < 0.6
    pair |= torch.eye(12, dtype=torch.bool)
    pos = torch.arange(12)[None]
    assert close(hf.logits(x[:1], pair_mask=pair, position_ids=pos), nat.logits(x[:1], pair_mask=pair, position_ids=pos))


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_block_cache_matches(pairs, mode):
    from codila_cli.models.dream import BlockCache

    hf, nat = pairs["transformers"][0], pairs["native"][0]
    x = torch.randint(5, 300, (1, 20))
    a, b = BlockCache(hf, mode), BlockCache(nat, mode)
    assert close(a.refresh(x, 0, 20), b.refresh(x, 0, 20))
    x[0, 9] = 7  # a commit inside the block: the cached suffix is now stale, the same way for both
    assert close(a.logits(x, 8, 12), b.logits(x, 8, 12))


def test_ar_prefill_and_cached_steps_match(pairs):
    hf, nat = pairs["transformers"][1], pairs["native"][1]
    emb = hf.embedding[torch.randint(5, 300, (1, 6))]
    la, ca = hf.forward(inputs_embeds=emb, cache=None)
    lb, cb = nat.forward(inputs_embeds=emb, cache=None)
    assert close(la, lb)
    for step in range(3):  # one token, then two at once on a cache
        nxt = hf.embedding[torch.randint(5, 300, (1, 1 + step % 2))]
        la, ca = hf.forward(inputs_embeds=nxt, cache=ca)
        lb, cb = nat.forward(inputs_embeds=nxt, cache=cb)
        assert close(la, lb)
    seq = hf.embedding[torch.randint(5, 300, (3, 7))]
    assert close(hf.model(inputs_embeds=seq, use_cache=False).logits, nat.model(inputs_embeds=seq, use_cache=False).logits)


@pytest.mark.parametrize("decoder,cfg", [
    ("dream", DreamConfig(max_new_tokens=16, tokens_per_step=2)),
    ("threshold", ThresholdConfig(max_new_tokens=16, block_length=8, threshold=0.5, cache="dual")),
    ("codila", CodilaConfig(max_new_tokens=16, block_size=4, cache="prefix")),
])
def test_whole_decodes_agree(tiny, monkeypatch, decoder, cfg):
    from codila_cli.engine.generate import generate
    from codila_cli.engine.models import load_models

    texts = []
    for engine in ("transformers", "native"):
        monkeypatch.setenv("CODILA_ENGINE", engine)
        models = load_models(dlm=str(tiny["dlm"]), ar=str(tiny["ar"]), device="cpu", dtype="float32")
        r = generate(models, "def f(x):", decoder=decoder, config=cfg, seed=3)
        texts.append((r.text, r.metrics["dlm_forwards"], r.metrics["ar_forwards"]))
    assert texts[0] == texts[1]


def test_native_tokenizer_matches_the_fast_tokenizer():
    from codila_cli.models.native_tokenizer import NativeTokenizer
    from codila_cli.models.registry import bundled_path
    from codila_cli.models.tokens import load_tokenizer

    path = bundled_path("bundled-dlm")
    fast, nat = load_tokenizer(path, name="b"), load_tokenizer(path, name="b", native=True)
    assert isinstance(nat, NativeTokenizer)
    samples = ["def fib(n):\n    return n\n", "x = {'a': [1, 2]}  # é ✓\n\tpass", "<|mask|><|endoftext|>a", ""]
    for s in samples:
        ids = fast.encode(s, add_special_tokens=False)
        assert nat.encode(s) == ids
        for skip in (True, False):
            assert nat.decode(ids, skip_special_tokens=skip) == fast.decode(ids, skip_special_tokens=skip)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "mask_token_id"):
        assert getattr(nat, key) == getattr(fast, key)
    assert len(nat) == len(fast) and nat.get_vocab() == fast.get_vocab()
    assert nat.convert_ids_to_tokens(list(range(50))) == fast.convert_ids_to_tokens(list(range(50)))


def test_engine_choice(tiny, monkeypatch):
    from codila_cli.errors import UsageError
    from codila_cli.models.loading import engine_for, read_config
    from codila_cli.models.registry import bundled_path

    bundled = bundled_path("bundled-dlm")
    cfg = read_config(bundled, name="b")
    assert engine_for(bundled, cfg) == "native"
    assert engine_for(tiny["dlm"], read_config(tiny["dlm"], name="t")) == "transformers"
    monkeypatch.setenv("CODILA_ENGINE", "transformers")
    assert engine_for(bundled, cfg) == "transformers"
    monkeypatch.setenv("CODILA_ENGINE", "native")
    assert engine_for(tiny["dlm"], read_config(tiny["dlm"], name="t")) == "native"
    assert engine_for(bundled, {**cfg, "rope_parameters": {"rope_type": "yarn"}}) == "transformers"
    monkeypatch.setenv("CODILA_ENGINE", "fast")
    with pytest.raises(UsageError):
        engine_for(bundled, cfg)


def test_bundled_gen_never_imports_transformers_or_dynamo():
    """A short gen on the bundled pair imports neither transformers nor torch._dynamo (about 1 s each;
    building a model on the meta device used to pull in the latter: docs/results/history.md §2, session 10)."""
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom codila_cli.cli import app\n"
            "r = CliRunner().invoke(app, ['gen', '--max-new-tokens', '8', '--seed', '0', 'def f(x):'])\n"
            "assert r.exit_code == 0, r.stderr\n"
            "print('transformers' in sys.modules, 'torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False False"
