"""Random checkpoints with the real models' shapes and token layout, for speed measurements at scale.

    python -m codila_cli.train.shaped OUT_DIR [--dlm dream-coder-7b|dreamon-7b] [--ar qwen3-0.6b] [--device cuda]

No hub download can reach real weights here, so the 7B numbers of issue 10 (forward cost, sampler
overhead, cache gains at Dream-Coder-7B / Qwen3-0.6B size) are measured on random weights of exactly
their shapes: OUT_DIR/dlm (Dream layout: bidirectional Qwen2, untied head, 152064 vocabulary rows) and
OUT_DIR/ar (Qwen3 layout, tied, 151936 rows), loaded by the real loader. Both share a word-level
tokenizer of 151643 ordinary tokens followed by each model's own special tokens at the real ids
(the checkpoints' own tokenizer and config files: eos 151643, Dream's bos / mask at 151665 / 151666 where Qwen3
has ``<tool_response>`` / ``</tool_response>``, Qwen3's ``<think>`` / ``</think>`` at 151667 / 151668),
so the vocabulary bridge meets the same collisions as with the real pair.

Random weights give random text: the per-forward costs are real, the number of forwards is not (a
random helper's guesses rarely hold, a random DLM is rarely confident). Read such a run for the time
per forward and the share outside forwards, not for tokens per step.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
                 "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                 "<|repo_name|>", "<|file_sep|>"]  # ids ordinary + 0 … + 21, shared by both models
DREAM_EXTRA = ["<|beginoftext|>", "<|mask|>"]  # + 22, + 23 (DreamOn adds <|expand|> at + 24)
QWEN3_EXTRA = ["<tool_response>", "</tool_response>", "<think>", "</think>"]  # + 22 … + 25


@dataclass(frozen=True)
class Shape:
    """One network's dimensions. ``extra_rows``: embedding rows past the ordinary tokens (specials and
    padding), so the real vocabulary sizes are ``ordinary + extra_rows``."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    extra_rows: int
    tied: bool
    dream: bool
    infill: bool = False  # DreamOn: also <|expand|> (at + 24, where Qwen3 has <think>)

    def __post_init__(self) -> None:
        if min(self.hidden, self.intermediate, self.layers, self.heads, self.kv_heads, self.head_dim) < 1:
            raise ValueError("every dimension must be >= 1")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.infill and not self.dream:
            raise ValueError("only a Dream shape can be an infilling (DreamOn) model")
        if self.extra_rows < len(QWEN_SPECIALS) + (len(DREAM_EXTRA) + 1 if self.dream else len(QWEN3_EXTRA)):
            raise ValueError("extra_rows must hold the special tokens")


PRESETS: dict[str, Shape] = {
    # Qwen2.5-Coder-7B, which Dream-Coder-7B is initialised from (arXiv 2508.15487)
    "dream-coder-7b": Shape(hidden=3584, intermediate=18944, layers=28, heads=28, kv_heads=4, head_dim=128,
                            extra_rows=152064 - 151643, tied=False, dream=True),
    # DreamOn-v0-7B: Dream-Coder-7B's shape with <|expand|>
    "dreamon-7b": Shape(hidden=3584, intermediate=18944, layers=28, heads=28, kv_heads=4, head_dim=128,
                        extra_rows=152064 - 151643, tied=False, dream=True, infill=True),
    # Qwen3-0.6B, CoDiLA's AR helper (arXiv 2603.20216)
    "qwen3-0.6b": Shape(hidden=1024, intermediate=3072, layers=28, heads=16, kv_heads=8, head_dim=128,
                        extra_rows=151936 - 151643, tied=True, dream=False),
}
REAL_ORDINARY = 151643  # ordinary tokens before <|endoftext|> in the Qwen2.5 / Qwen3 tokenizers


def _tokenizer(ordinary: int, extra: list[str]) -> Any:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(ordinary)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(s, special=True) for s in QWEN_SPECIALS + extra])
    return tok


def _config(shape: Shape, ordinary: int) -> dict:
    ids = {name: ordinary + QWEN_SPECIALS.index(name) for name in ("<|endoftext|>", "<|im_end|>")}
    cfg = {"hidden_size": shape.hidden, "intermediate_size": shape.intermediate, "num_hidden_layers": shape.layers,
           "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads,
           "vocab_size": ordinary + shape.extra_rows, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
           "tie_word_embeddings": shape.tied, "hidden_act": "silu", "eos_token_id": ids["<|endoftext|>"],
           "pad_token_id": ids["<|endoftext|>"], "dtype": "bfloat16"}
    if shape.dream:
        base = ordinary + len(QWEN_SPECIALS)
        cfg.update(model_type="Dream", architectures=["DreamModel"], max_position_embeddings=131072,
                   bos_token_id=base, mask_token_id=base + 1)
    else:
        cfg.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=shape.head_dim,
                   max_position_embeddings=40960, attention_bias=False, bos_token_id=ids["<|endoftext|>"])
    return cfg


def _weights(shape: Shape, vocab: int, *, device: Any, generator: Any) -> dict:
    """Random weights (std 0.02, norms 1) under the Qwen2 / Qwen3 state-dict names, in bf16 on the CPU."""
    import torch

    def rand(*size: int) -> torch.Tensor:
        t = torch.empty(*size, device=device, dtype=torch.float32).normal_(0.0, 0.02, generator=generator)
        return t.to(torch.bfloat16).cpu()

    h, d = shape.hidden, shape.head_dim
    state = {"model.embed_tokens.weight": rand(vocab, h), "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    if not shape.tied:
        state["lm_head.weight"] = rand(vocab, h)
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        state[p + "self_attn.q_proj.weight"] = rand(shape.heads * d, h)
        state[p + "self_attn.k_proj.weight"] = rand(shape.kv_heads * d, h)
        state[p + "self_attn.v_proj.weight"] = rand(shape.kv_heads * d, h)
        state[p + "self_attn.o_proj.weight"] = rand(h, shape.heads * d)
        if shape.dream:  # Qwen2: q/k/v with bias
            for k, n in (("q", shape.heads), ("k", shape.kv_heads), ("v", shape.kv_heads)):
                state[p + f"self_attn.{k}_proj.bias"] = rand(n * d)
        else:  # Qwen3: q/k norms
            state[p + "self_attn.q_norm.weight"] = torch.ones(d, dtype=torch.bfloat16)
            state[p + "self_attn.k_norm.weight"] = torch.ones(d, dtype=torch.bfloat16)
        state[p + "mlp.gate_proj.weight"] = rand(shape.intermediate, h)
        state[p + "mlp.up_proj.weight"] = rand(shape.intermediate, h)
        state[p + "mlp.down_proj.weight"] = rand(h, shape.intermediate)
        state[p + "input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        state[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    return state


def build_shaped(out: Path, *, dlm: Shape | str = "dream-coder-7b", ar: Shape | str = "qwen3-0.6b",
                 ordinary: int = REAL_ORDINARY, device: str = "cpu", seed: int = 0) -> dict[str, Path]:
    """Write OUT/dlm and OUT/ar (config.json, tokenizer.json, tokenizer_config.json, model.safetensors)
    with random weights; returns their paths. ``ordinary`` < 151643 scales the vocabulary down (tests)."""
    import torch
    from safetensors.torch import save_file

    if ordinary < 1:
        raise ValueError(f"ordinary must be >= 1, got {ordinary}")
    gen = torch.Generator(device=device).manual_seed(seed)
    paths = {}
    for role, spec in (("dlm", dlm), ("ar", ar)):
        shape = PRESETS[spec] if isinstance(spec, str) else spec
        if shape.dream != (role == "dlm"):
            raise ValueError(f"the {role} needs a {'Dream' if role == 'dlm' else 'causal (Qwen3)'} shape")
        extra = (DREAM_EXTRA + ["<|expand|>"] * shape.infill) if shape.dream else QWEN3_EXTRA
        d = out / role
        d.mkdir(parents=True, exist_ok=True)
        cfg = _config(shape, ordinary)
        _tokenizer(ordinary, extra).save(str(d / "tokenizer.json"))
        tok_cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                   "pad_token": "<|endoftext|>", "model_max_length": 131072, "clean_up_tokenization_spaces": False}
        if shape.dream:
            tok_cfg.update(bos_token="<|beginoftext|>", mask_token="<|mask|>")
        (d / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
        state = _weights(shape, cfg["vocab_size"], device=device, generator=gen)
        tmp = d / ".model.safetensors.partial"
        save_file(state, str(tmp), metadata={"format": "pt"})  # streamed to disk, then renamed: never half a file
        os.replace(tmp, d / "model.safetensors")
        del state
        (d / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        paths[role] = d
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--dlm", default="dream-coder-7b", choices=sorted(p for p in PRESETS if PRESETS[p].dream))
    ap.add_argument("--ar", default="qwen3-0.6b", choices=sorted(p for p in PRESETS if not PRESETS[p].dream))
    ap.add_argument("--device", default="cpu", help="where the random numbers are drawn (cuda is faster)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    for k, v in build_shaped(args.out, dlm=args.dlm, ar=args.ar, device=args.device, seed=args.seed).items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
