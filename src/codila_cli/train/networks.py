"""The networks of the bundled models: their shapes, how a stage builds, loads and exports them."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    max_positions: int = 1024


DLM_SHAPE = Shape(hidden=256, layers=6, heads=4, kv_heads=2, intermediate=768, max_positions=512)
# the helper: session 1 shipped "small" (1.9 M parameters); "base" (4.5 M, still below the DLM's 6.8 M)
AR_SHAPES = {"small": Shape(hidden=160, layers=2, heads=4, kv_heads=2, intermediate=480, max_positions=512),
             "base": Shape(hidden=256, layers=3, heads=4, kv_heads=2, intermediate=768, max_positions=512)}
AR_LR = {"small": 3e-3, "base": 2e-3}


def qwen2(shape: Shape, vocab: int, ids: dict):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                      num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                      num_key_value_heads=shape.kv_heads, max_position_embeddings=shape.max_positions,
                      rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=ids["bos"],
                      eos_token_id=ids["eos"], pad_token_id=ids["eos"])
    cfg._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(cfg)


def qwen3(shape: Shape, vocab: int, ids: dict):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                      num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                      num_key_value_heads=shape.kv_heads, head_dim=shape.hidden // shape.heads,
                      max_position_embeddings=shape.max_positions, rope_theta=10000.0,
                      tie_word_embeddings=True, bos_token_id=ids["bos"], eos_token_id=ids["eos"],
                      pad_token_id=ids["eos"])
    cfg._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(cfg)


def export_checkpoint(model, directory: Path, *, dream: bool, ids: dict, run: Path, meta: dict) -> None:
    from codila_cli.models.export import save_checkpoint

    specials = {"eos": ids["eos"], "pad": ids["eos"], "bos": ids["bos"]}
    if dream:
        specials["mask"] = ids["mask"]
    save_checkpoint(model, directory, dream=dream, specials=specials, dtype="bfloat16",
                    extra_config={"codila_training": meta})
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(run / "tokenizer" / f, directory / f)


def bidirectional(model):
    """Turn the Qwen2 network's attention bidirectional (a Dream DLM); returns the model."""
    for module in model.modules():
        if hasattr(module, "is_causal"):
            module.is_causal = False
    return model


def final_dlm_dir(run: Path) -> Path:
    """The finished DLM: the prompt-conditioned ``sft`` stage when it ran, else the ``dlm`` stage."""
    sft = run / "sft" / "final"
    return sft if (sft / "model.safetensors").is_file() else run / "dlm" / "final"


def ar_shape(run: Path) -> Shape:
    """The helper shape this run's ``ar`` stage chose (``RUN/ar/shape.json``; "small" for runs older than it)."""
    f = run / "ar" / "shape.json"
    return Shape(**json.loads(f.read_text())) if f.is_file() else AR_SHAPES["small"]


def load_helper(model, init: Path) -> None:
    """``init``'s weights into ``model`` (fp32), refusing a helper of another shape or vocabulary."""
    from safetensors.torch import load_file

    state = load_file(str(init / "model.safetensors"))
    if "lm_head.weight" not in state:  # tied embeddings are stored once
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    own = model.state_dict()
    wrong = sorted(k for k in own if k not in state or state[k].shape != own[k].shape)
    extra = sorted(set(state) - set(own))
    if wrong or extra:
        raise ValueError(f"--init {init} is not a helper of this shape and vocabulary "
                         f"({len(wrong)} missing or differently shaped tensors, {len(extra)} unexpected)")
    model.load_state_dict({k: v.float() for k, v in state.items()})


def dlm_from_final(run: Path, stage: str, ids: dict, *, init: Path | None = None):
    """The finished DLM (or the Dream checkpoint directory ``init``) as a trainable bidirectional
    network (fresh start of a fine-tune stage)."""
    model = qwen2(DLM_SHAPE, ids["vocab"], ids)
    if not (run / stage / "ckpt.pt").exists():  # a resumed run loads its own checkpoint instead
        from safetensors.torch import load_file

        state = load_file(str((init or final_dlm_dir(run)) / "model.safetensors"))
        model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
        model.tie_weights()
    return bidirectional(model)
