"""Write checkpoints in the exact Hugging Face layouts codila loads (Dream DLM, Qwen3-style AR)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from codila_cli.atomic import write_bytes_atomic


def save_checkpoint(model: Any, directory: Path, *, dream: bool, specials: dict[str, int],
                    dtype: str = "float32", extra_config: dict | None = None) -> None:
    """Save ``model`` (a transformers causal LM) as config.json + model.safetensors.

    ``dream=True`` writes ``model_type: "Dream"`` with the Qwen2 field set, which is how Dream-org
    checkpoints describe themselves; codila rebuilds them as bidirectional Qwen2 on load.
    """
    import torch
    from safetensors.torch import save

    directory.mkdir(parents=True, exist_ok=True)
    cfg = model.config.to_dict()
    for key in ("_name_or_path", "transformers_version", "architectures", "torch_dtype", "dtype",
                "_attn_implementation_autoset", "output_attentions", "output_hidden_states"):
        cfg.pop(key, None)
    if dream:
        cfg["model_type"] = "Dream"
        cfg["architectures"] = ["DreamModel"]
    else:
        cfg["architectures"] = [type(model).__name__]
    cfg["dtype"] = dtype
    cfg.update({f"{k}_token_id": v for k, v in specials.items()})
    cfg.update(extra_config or {})
    tdtype = getattr(torch, dtype)
    state = {}
    for k, v in model.state_dict().items():
        if cfg.get("tie_word_embeddings") and k == "lm_head.weight":
            continue
        state[k] = v.detach().to("cpu", tdtype if v.is_floating_point() else v.dtype).contiguous()
    write_bytes_atomic(directory / "model.safetensors", save(state, metadata={"format": "pt"}))
    (directory / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
