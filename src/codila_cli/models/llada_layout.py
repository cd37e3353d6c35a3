"""LLaDA's checkpoint layout (pure Python, imported by models/native.py and models/loading.py): which
configs codila's network runs, their NativeConfig fields, and LLaDA's tensor names mapped onto the native
network's (models/llada.py has the denoiser and the loader)."""

from __future__ import annotations

import re

# LLaDA's tensor names -> the native network's (models/native.py, transformers' LLaMA/Qwen2 names)
_RENAMES = (
    (r"^model\.transformer\.wte\.weight$", "model.embed_tokens.weight"),
    (r"^model\.transformer\.ln_f\.weight$", "model.norm.weight"),
    (r"^model\.transformer\.ff_out\.weight$", "lm_head.weight"),
    (r"^model\.transformer\.blocks\.(\d+)\.(q_proj|k_proj|v_proj)\.", r"model.layers.\1.self_attn.\2."),
    (r"^model\.transformer\.blocks\.(\d+)\.attn_out\.", r"model.layers.\1.self_attn.o_proj."),
    (r"^model\.transformer\.blocks\.(\d+)\.ff_proj\.", r"model.layers.\1.mlp.gate_proj."),
    (r"^model\.transformer\.blocks\.(\d+)\.up_proj\.", r"model.layers.\1.mlp.up_proj."),
    (r"^model\.transformer\.blocks\.(\d+)\.ff_out\.", r"model.layers.\1.mlp.down_proj."),
    (r"^model\.transformer\.blocks\.(\d+)\.attn_norm\.", r"model.layers.\1.input_layernorm."),
    (r"^model\.transformer\.blocks\.(\d+)\.ff_norm\.", r"model.layers.\1.post_attention_layernorm."),
)


def unsupported(cfg: dict) -> str | None:
    """What in a LLaDA config codila's network does not implement (None: everything it needs)."""
    checks = (
        (cfg.get("block_type", "llama") == "llama", f"block_type {cfg.get('block_type')!r} (codila runs 'llama')"),
        (cfg.get("activation_type", "silu") == "silu", f"activation {cfg.get('activation_type')!r} (codila runs 'silu')"),
        (cfg.get("rope", True) and not cfg.get("alibi", False), "a model without RoPE"),
        (cfg.get("layer_norm_type", "rms") == "rms", f"layer norm {cfg.get('layer_norm_type')!r}"),
        (not cfg.get("attention_layer_norm", False), "q/k layer norms"),
        (not cfg.get("include_bias", False), "biases on every linear layer"),
        (not cfg.get("input_emb_norm", False) and not cfg.get("scale_logits", False), "scaled embeddings or logits"),
        (cfg.get("layer_norm_with_affine", True) and not cfg.get("bias_for_layer_norm", False), "layer-norm biases"),
        (not cfg.get("rope_scaling"), "RoPE scaling"),
    )
    return next((what for ok, what in checks if not ok), None)


def native_fields(cfg: dict) -> dict | None:
    """The models/native.py NativeConfig fields of a LLaDA config (None when it asks for something else)."""
    if unsupported(cfg) is not None:
        return None
    d, heads = int(cfg["d_model"]), int(cfg["n_heads"])
    hidden = cfg.get("mlp_hidden_size") or int(cfg.get("mlp_ratio", 4)) * d
    kv = cfg.get("n_kv_heads") or (1 if cfg.get("multi_query_attention") else heads)
    return {"kind": "llada", "vocab_size": int(cfg.get("embedding_size") or cfg["vocab_size"]), "hidden_size": d,
            "intermediate_size": int(hidden), "num_hidden_layers": int(cfg["n_layers"]), "num_attention_heads": heads,
            "num_key_value_heads": int(kv), "head_dim": d // heads, "rms_norm_eps": float(cfg.get("rms_norm_eps", 1e-5)),
            "rope_theta": float(cfg.get("rope_theta", 10000.0)), "tie_word_embeddings": bool(cfg.get("weight_tying", False)),
            "attention_bias": bool(cfg.get("include_qkv_bias", False)),
            "max_position_embeddings": int(cfg.get("max_sequence_length", 4096))}


def rename_state(state: dict) -> dict:
    """LLaDA's tensor names -> the native network's, in place (an unknown name is kept, so the strict key
    check names it)."""
    for key in list(state):
        new = key
        for pattern, repl in _RENAMES:
            new, n = re.subn(pattern, repl, key)
            if n:
                break
        if new != key:
            state[new] = state.pop(key)
    return state
