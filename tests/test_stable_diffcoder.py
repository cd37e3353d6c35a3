"""Stable-DiffCoder, the fourth family (issue 61): a ``model_type: llama`` checkpoint is recognised by its
remote class, runs on codila's native Llama network with the block-causal mask and exact cache, and
decoding/block.py with the family's rules reproduces the official ``generate_block`` token for token
(tests/fixtures/stable_diffcoder/); gen, the server and ``codila models`` name the family."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from golden_cases import AVX2, assert_block_matches, pinned_results
from stable_diffcoder_cases import CASES, SDC_DIR

from codila_cli.models.families import family_of, load_dlm

needs_avx2 = pytest.mark.skipif(not AVX2, reason="the goldens are pinned to torch's AVX2 CPU kernels")
A = SDC_DIR / "checkpoints" / "sdc-tiny-a"
EOS = 514


def _text(ids: list[int], prompt_len: int) -> list[int]:
    """The ids up to the first end-of-text of the answer (included): where the text ends. The official loop
    then writes end-of-text over the rest of that block; codila fills the slots after the block with it."""
    gen = ids[prompt_len:]
    return ids[: prompt_len + gen.index(EOS) + 1] if EOS in gen else ids


results = pinned_results("stable_diffcoder_cases.py")


@needs_avx2
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c['id']}-{c['group']}")
def test_block_decoding_matches_the_official_generate_block(case, results):
    """Same ids, and the same forwards: the official ``nfe`` leaves out the prompt's prefill, which codila's
    count includes (every network call)."""
    ids, forwards = results[case["id"]]
    P, B = len(case["input_ids"][0]), case["settings"]["block_length"]
    want = case["expected_ids_mask_banned" if case["mask_ban_changes_output"] else "expected_ids"][0]
    assert _text(ids, P) == _text(want, P)
    assert forwards == case["forwards"] + (P >= B)


def test_the_goldens_exercise_what_they_claim():
    s = [c["settings"] for c in CASES]
    assert len(CASES) == 27 and not any(c["official_fails"] for c in CASES)
    assert {x["block_length"] for x in s} == {4, 8} and {x["remasking"] for x in s} == {"low_confidence", "random"}
    assert any(x["threshold"] is not None for x in s) and any(x["temperature"] > 0 for x in s)
    assert any(x["steps"] < x["gen_length"] for x in s)  # two slots per forward
    stops = [c for c in CASES if EOS in c["expected_ids"][0][len(c["input_ids"][0]):]]
    assert 5 <= len(stops) < len(CASES)  # texts that end (no cache append after their block) and texts that run on
    lengths = [len(c["input_ids"][0]) % c["settings"]["block_length"] for c in CASES]
    assert 0 in lengths and any(lengths)  # prompts that end on a block boundary and mid-block


def test_a_llama_checkpoint_is_stable_diffcoder_only_when_it_names_the_remote_class(tmp_path):
    """The released checkpoint says ``model_type: llama``; its remote class in ``architectures`` or
    ``auto_map`` makes it Stable-DiffCoder. A plain Llama is an AR model: no family claims it, so it is
    refused as a DLM and loads as a helper; the diffusion model is refused as a helper."""
    cfg = json.loads((A / "config.json").read_text())
    assert family_of(cfg).name == "stable-diffcoder"
    assert family_of({**cfg, "architectures": [], "auto_map": {"AutoModelForCausalLM": "x.StableDiffcoderForCausalLM"}})
    plain = {**cfg, "architectures": ["LlamaForCausalLM"]}
    plain.pop("auto_map")
    assert family_of(plain) is None
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = tmp_path / "llama"
    LlamaForCausalLM(LlamaConfig(vocab_size=576, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=2, eos_token_id=EOS)).save_pretrained(llama)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (llama / name).write_bytes((A / name).read_bytes())
    from codila_cli.errors import ModelLoadError
    from codila_cli.models.ar import load_ar

    with pytest.raises(ModelLoadError, match="not a diffusion model codila runs"):
        load_dlm(llama, name="llama", device=torch.device("cpu"), dtype=torch.float32)
    assert load_ar(llama, name="llama", device=torch.device("cpu"), dtype=torch.float32).vocab_rows == 576
    with pytest.raises(ModelLoadError, match="stable-diffcoder diffusion model, not an autoregressive helper"):
        load_ar(A, name="sdc", device=torch.device("cpu"), dtype=torch.float32)


def test_the_native_network_is_llama_with_the_block_mask_and_the_cache_is_exact():
    """The checkpoint on models/native.py (kind llama) equals transformers' LlamaForCausalLM under the
    block-causal mask to 1e-5, block by block against the cache; the mask token is ``<[MASK_TOKEN]>``,
    found by its string (the tokenizer does not declare it)."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    dlm = load_dlm(A, name="a", device=torch.device("cpu"), dtype=torch.float32)
    assert dlm.model.config.kind == "llama" and dlm.specials.mask == 515 and dlm.block_diffusion
    cfg = json.loads((A / "config.json").read_text())
    hf = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k not in (
        "architectures", "auto_map", "model_type", "transformers_version", "torch_dtype")}))
    hf.load_state_dict(load_file(str(A / "model.safetensors")))
    assert_block_matches(hf, dlm, vocab=515)


def _gen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "codila_cli", "gen", "--dlm", str(A), "--seed", "0", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def test_gen_and_the_server_run_it_and_name_the_family():
    r = _gen("--json", "--max-new-tokens", "10", "--no-early-stop", "def f(x):")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["decoder"] == "block" and doc["settings"]["block_length"] == 4  # the sampler's default block
    assert doc["models"]["dlm"]["family"] == "stable-diffcoder" and doc["metrics"]["tokens"] == 10
    r = _gen("--decoder", "dream", "x")
    assert r.returncode == 2 and "block-diffusion model" in r.stderr
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from test_serve import Server

    s = Server("--dlm", str(A), "-q")
    try:
        out = httpx.post(s.url + "/v1/completions", json={"prompt": "def f(x):", "max_tokens": 6, "seed": 1},
                         timeout=60).json()
        assert out["codila"]["choices"][0]["decoder"] == "block" and out["usage"]["completion_tokens"] <= 6
        assert httpx.get(s.url + "/health").json()["family"] == "stable-diffcoder"
        assert httpx.get(s.url + "/api/tags").json()["models"][0]["details"]["family"] == "stable-diffcoder"
    finally:
        s.stop()


def test_codila_models_lists_the_family_and_its_alias_with_the_licence():
    r = subprocess.run([sys.executable, "-m", "codila_cli", "models", "--json"], capture_output=True, text=True,
                       timeout=60, check=True)
    doc = json.loads(r.stdout)
    fam = {f["name"]: f for f in doc["families"]}["stable-diffcoder"]
    assert fam["decoders"] == ["block", "codila"] and fam["infill"] == "no" and "MIT" in fam["licence"]
    assert "public copy of the official generate_block" in fam["verified"]
    alias = {m["alias"]: m for m in doc["models"]}["stable-diffcoder-8b"]
    assert alias["family"] == "stable-diffcoder" and alias["licence"] == "MIT"
    assert alias["repo"] == "ByteDance-Seed/Stable-DiffCoder-8B-Instruct"
    table = subprocess.run([sys.executable, "-m", "codila_cli", "models"], capture_output=True, text=True,
                           timeout=60, check=True).stdout
    assert "stable-diffcoder parity: token-identical on goldens made with a public copy" in table


def test_a_family_is_one_module():
    """Adding Stable-DiffCoder took its module and its line in the registry: no other source file names the
    family or imports its module (the alias table names its repository, which is data, and the sampler's
    rules are the row's). The three older families are read the same way: no ``if family.name ==`` left."""
    import re

    from codila_cli.models import families

    src = Path(families.__file__).resolve().parent.parent
    own = {src / "models" / "stable_diffcoder.py", src / "models" / "families.py", src / "models" / "registry.py"}
    named = [p for p in src.rglob("*.py") if p not in own and re.search(
        r"stable.?diffcoder|StableDiffcoder", p.read_text(), re.IGNORECASE)]
    assert named == []
    assert "stable_diffcoder" in families.MODULES
    by_name = [p for p in src.rglob("*.py") if re.search(r"family\.name ==", p.read_text())]
    assert by_name == []
    # the decoders run through one registry (no name-by-name chain), and what a network is (its shift, its
    # architecture) comes from the row, not from a class attribute or a model_type test
    assert not re.search(r"decoder == \"", (src / "engine" / "generate.py").read_text())
    duck = [p for p in src.rglob("*.py") if re.search(r"^\s+shifted = |getattr\(\w+, \"(shifted|block_diffusion)\"",
                                                     p.read_text(), re.MULTILINE)]
    assert duck == []
    native = (src / "models" / "native.py").read_text()
    assert not re.search(r"\"(dream|sdar)\"", native), "native.py builds networks; a family's row names its network"


def test_codila_runs_inside_its_blocks_with_a_helper_bridged_by_token_strings(tmp_path):
    """No small model shares Seed-Coder's vocabulary, so a helper is paired by token strings
    (models/token_map.py): a tiny Qwen3 whose tokenizer holds the same pieces under other ids writes the
    blocks, and gen says how the pair was made."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    out = tmp_path / "helper"
    Qwen3ForCausalLM(Qwen3Config(vocab_size=576, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
                                 eos_token_id=EOS)).save_pretrained(out)
    tok = json.loads((A / "tokenizer.json").read_text())
    perm = torch.randperm(512, generator=torch.Generator().manual_seed(1)).tolist()
    tok["model"]["vocab"] = {t: (perm[i] if i < 512 else i) for t, i in tok["model"]["vocab"].items()}
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    (out / "tokenizer_config.json").write_bytes((A / "tokenizer_config.json").read_bytes())
    r = _gen("--ar", str(out), "--json", "--max-new-tokens", "8", "def f(x):")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["decoder"] == "codila" and doc["metrics"]["ar_forwards"] >= 1
    assert doc["models"]["ar"]["bridge"]["by"] == "strings" and "pairs their tokens by string" in r.stderr


def test_infill_and_plan_refuse_it_from_its_family_row(tmp_path):
    """The row says infill "no" and plan False: both commands refuse with one error and a hint (exit 2), and
    the file to fill is left as it was."""
    src = tmp_path / "a.py"
    src.write_text("def f(x):\n    # codila: fill\n")
    for args in (["infill", "--dlm", str(A), str(src)], ["plan", "--dlm", str(A), "a tool that counts words"]):
        r = subprocess.run([sys.executable, "-m", "codila_cli", *args], capture_output=True, text=True, timeout=120,
                           check=False)
        assert r.returncode == 2 and "is a stable-diffcoder model" in r.stderr and "Hint:" in r.stderr, r.stderr
    assert src.read_text() == "def f(x):\n    # codila: fill\n"


def test_top_k_filters_its_gumbel_draws():
    """Its sampler has no top-k; codila's filters the logits before the Gumbel draw (as for LLaDA): with
    top-k 1 only the argmax can be drawn, so the seed changes nothing; without it, it does."""
    from codila_cli.decoding.block import BlockConfig, decode_block
    from codila_cli.decoding.config import SamplingConfig

    dlm = load_dlm(A, name="a", device=torch.device("cpu"), dtype=torch.float32)
    ids = list(range(40, 58))

    def run(seed: int, **sampling) -> list[int]:
        cfg = BlockConfig(max_new_tokens=12, block_length=4, early_stop=False,
                          sampling=SamplingConfig(temperature=1.0, **sampling))
        return decode_block(dlm, ids, config=cfg, generator=torch.Generator().manual_seed(seed)).canvas

    assert run(1, top_k=1) == run(2, top_k=1) == run(3, top_k=1)
    assert len({tuple(run(s)) for s in (1, 2, 3)}) > 1
