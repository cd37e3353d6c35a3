"""A random checkpoint at each new family's real width loads through the real loader and decodes (issues 51,
61): LLaDA-8B's layer (d_model 4096, 32 heads, MLP 12288, RoPE θ 500000), SDAR-1.7B's (hidden 2048, 16 / 8
heads of 128, MLP 6144) and Stable-DiffCoder-8B's (hidden 4096, 32 / 8 heads, MLP 14336), one layer each and a 2,048-row vocabulary, written as the released checkpoints
are (config.json keys, tensor names, bf16 safetensors): the per-tensor load, rename and cast paths at full
width, without an 8-GiB file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from codila_cli.models.families import load_dlm

pytestmark = pytest.mark.slow
FIXTURES = Path(__file__).resolve().parent / "fixtures"
VOCAB = 2048


def _write(out: Path, config: dict, shapes: dict[str, tuple[int, ...]], tokenizer_from: Path) -> Path:
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    state = {name: (torch.randn(shape, generator=g) * (0.02 if len(shape) > 1 else 0) + (1 if len(shape) == 1 else 0)
                    ).to(torch.bfloat16) for name, shape in shapes.items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_from / name, out / name)
    return out


def test_a_real_width_llada_layer_loads_and_decodes(tmp_path):
    src = FIXTURES / "llada" / "checkpoints" / "llada-tiny-a"
    cfg = {**json.loads((src / "config.json").read_text()), "d_model": 4096, "n_heads": 32, "n_kv_heads": 32,
           "n_layers": 1, "mlp_hidden_size": 12288, "vocab_size": VOCAB, "embedding_size": VOCAB}
    d, m = 4096, 12288
    shapes = {"model.transformer.wte.weight": (VOCAB, d), "model.transformer.ln_f.weight": (d,),
              "model.transformer.ff_out.weight": (VOCAB, d), "model.transformer.blocks.0.attn_norm.weight": (d,),
              "model.transformer.blocks.0.ff_norm.weight": (d,), "model.transformer.blocks.0.ff_proj.weight": (m, d),
              "model.transformer.blocks.0.up_proj.weight": (m, d), "model.transformer.blocks.0.ff_out.weight": (d, m),
              **{f"model.transformer.blocks.0.{p}.weight": (d, d) for p in ("q_proj", "k_proj", "v_proj", "attn_out")}}
    path = _write(tmp_path / "llada", cfg, shapes, src)
    dlm = load_dlm(path, name="llada-real-width", device=torch.device("cpu"), dtype=torch.float32)
    from codila_cli.decoding.llada import LladaConfig, decode_llada

    res = decode_llada(dlm, [513, 300, 301, 302], config=LladaConfig(max_new_tokens=8, block_length=4, early_stop=False))
    assert len(res.canvas) == 8 and dlm.specials.mask not in res.canvas and res.dlm_forwards == 8
    assert dlm.vocab_rows == VOCAB and bool(torch.isfinite(dlm.raw_logits(torch.tensor([[513, 517]]))).all())


def test_a_real_width_sdar_layer_loads_and_decodes(tmp_path):
    src = FIXTURES / "sdar" / "checkpoints" / "sdar-tiny-a"
    cfg = {**json.loads((src / "config.json").read_text()), "hidden_size": 2048, "num_attention_heads": 16,
           "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 6144, "num_hidden_layers": 1,
           "vocab_size": VOCAB, "tie_word_embeddings": True}
    d, m, hd = 2048, 6144, 128
    shapes = {"model.embed_tokens.weight": (VOCAB, d), "model.norm.weight": (d,),
              "model.layers.0.input_layernorm.weight": (d,), "model.layers.0.post_attention_layernorm.weight": (d,),
              "model.layers.0.self_attn.q_proj.weight": (16 * hd, d), "model.layers.0.self_attn.k_proj.weight": (8 * hd, d),
              "model.layers.0.self_attn.v_proj.weight": (8 * hd, d), "model.layers.0.self_attn.o_proj.weight": (d, 16 * hd),
              "model.layers.0.self_attn.q_norm.weight": (hd,), "model.layers.0.self_attn.k_norm.weight": (hd,),
              "model.layers.0.mlp.gate_proj.weight": (m, d), "model.layers.0.mlp.up_proj.weight": (m, d),
              "model.layers.0.mlp.down_proj.weight": (d, m)}
    path = _write(tmp_path / "sdar", cfg, shapes, src)
    dlm = load_dlm(path, name="sdar-real-width", device=torch.device("cpu"), dtype=torch.float32)
    from codila_cli.decoding.block import BlockConfig, decode_block

    res = decode_block(dlm, [513, 300, 301, 302, 303, 304], config=BlockConfig(max_new_tokens=8, block_length=4,
                                                                               early_stop=False))
    assert len(res.canvas) == 10 and dlm.specials.mask not in res.canvas  # to the block boundary: 6 + 10 = 16
    assert res.dlm_forwards == 1 + 3 * (4 + 1) - 2  # prefill; blocks 1-3: their masked slots, then the store


def test_a_real_width_stable_diffcoder_layer_loads_and_decodes(tmp_path):
    """Stable-DiffCoder-8B's layer (Llama: hidden 4096, 32 / 8 heads of 128, MLP 14336, no biases, untied
    head) under its released config keys (model_type llama, its remote class in architectures)."""
    src = FIXTURES / "stable_diffcoder" / "checkpoints" / "sdc-tiny-a"
    cfg = {**json.loads((src / "config.json").read_text()), "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336, "num_hidden_layers": 1,
           "vocab_size": VOCAB}
    d, m, hd = 4096, 14336, 128
    shapes = {"model.embed_tokens.weight": (VOCAB, d), "model.norm.weight": (d,), "lm_head.weight": (VOCAB, d),
              "model.layers.0.input_layernorm.weight": (d,), "model.layers.0.post_attention_layernorm.weight": (d,),
              "model.layers.0.self_attn.q_proj.weight": (32 * hd, d), "model.layers.0.self_attn.k_proj.weight": (8 * hd, d),
              "model.layers.0.self_attn.v_proj.weight": (8 * hd, d), "model.layers.0.self_attn.o_proj.weight": (d, 32 * hd),
              "model.layers.0.mlp.gate_proj.weight": (m, d), "model.layers.0.mlp.up_proj.weight": (m, d),
              "model.layers.0.mlp.down_proj.weight": (d, m)}
    path = _write(tmp_path / "sdc", cfg, shapes, src)
    dlm = load_dlm(path, name="sdc-real-width", device=torch.device("cpu"), dtype=torch.float32)
    from codila_cli.decoding.block import BlockConfig, decode_block

    assert dlm.family.name == "stable-diffcoder" and dlm.model.config.kind == "llama"
    res = decode_block(dlm, [512, 300, 301, 302, 303, 304], config=BlockConfig(max_new_tokens=8, block_length=4,
                                                                               early_stop=False))
    assert len(res.canvas) == 8 and dlm.specials.mask not in res.canvas  # its last block is cut at the limit
    assert res.dlm_forwards == 1 + (2 + 1) + (4 + 1) + (2 + 1)  # prefill; blocks of 2, 4, 2 masked slots + stores


def test_a_real_width_dream_layer_decodes_batched_as_alone_in_bf16(tmp_path, monkeypatch):
    """Issue 52 at Dream-Coder-7B's width (hidden 3584, 28 / 4 heads of 128, MLP 18944; one layer, a
    2,000-word vocabulary; train/shaped.py's random checkpoint through the real loader), in bf16: three
    prompts of other lengths decoded together give, row by row, the tokens each gives alone, greedy and
    seeded, and a packed forward gives each row its lone logits bit for bit. Skipped, naming the layer, where this CPU's own bf16 matrix product rounds a row by batch size."""
    from test_batch import _bf16_gemm_depends_on_the_batch

    from codila_cli.decoding.batch import StepBatcher
    from codila_cli.decoding.config import DreamConfig, SamplingConfig

    # each step waits for every row (the forward count below is exact, not a split a loaded machine causes)
    monkeypatch.setitem(StepBatcher.__init__.__kwdefaults__, "gather_s", 60.0)
    from codila_cli.engine.generate import generate, generate_many
    from codila_cli.engine.models import load_models
    from codila_cli.train.shaped import PRESETS, Shape, build_shaped

    wide = PRESETS["dream-coder-7b"]
    dlm_shape = Shape(hidden=wide.hidden, intermediate=wide.intermediate, layers=1, heads=wide.heads,
                      kv_heads=wide.kv_heads, head_dim=wide.head_dim, extra_rows=wide.extra_rows, tied=False, dream=True)
    ar_shape = Shape(hidden=32, intermediate=64, layers=1, heads=4, kv_heads=2, head_dim=8, extra_rows=293, tied=True,
                     dream=False)
    paths = build_shaped(tmp_path, dlm=dlm_shape, ar=ar_shape, ordinary=2000)
    monkeypatch.setenv("CODILA_ENGINE", "native")  # the engine that stacks every call (packed rows)
    models = load_models(dlm=str(paths["dlm"]), ar=None, device="cpu", dtype="bfloat16")
    if (why := _bf16_gemm_depends_on_the_batch(models.dlm.model)) is not None:
        pytest.skip(why)
    from codila_cli.models import batched

    g = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 2000, (n,), generator=g) for n in (7, 29, 16)]
    calls = [batched.KVCall(tokens=r, positions=torch.arange(len(r)), past=None, keep=torch.arange(len(r)))
             for r in rows]
    model = models.dlm.model
    with torch.inference_mode():
        for (logits, _), r in zip(batched.run(model, calls, causal=False), rows):  # every position's logits
            assert torch.equal(logits[0], model(r[None]).logits[0]), len(r)  # bit for bit, as alone
    prompts = ["t5 t17 t301 t9", "t44 t2 t1999 t7 t7 t80 t13 t600 t5 t11 t12", "t1000 t3 t3 t3 t4 t250"]
    for cfg, seeds in ((DreamConfig(max_new_tokens=8, tokens_per_step=2, early_stop=False), [0, 0, 0]),
                       (DreamConfig(max_new_tokens=8, tokens_per_step=2, early_stop=False,
                                    sampling=SamplingConfig(temperature=0.8)), [3, 4, 5])):
        alone = [generate(models, p, decoder="dream", config=cfg, seed=s).completion for p, s in zip(prompts, seeds)]
        together = generate_many(models, prompts, decoder="dream", config=cfg, seeds=seeds, batched=True)
        assert together.batched and together.batched_forwards == 4
        assert [r.completion for r in together.results] == alone, cfg
