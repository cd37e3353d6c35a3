"""LLaDA-family diffusion LMs (Nie et al. 2025, "Large Language Diffusion Models", arXiv 2502.09992):
checkpoints with ``model_type`` "llada" (LLaDA-8B-Base/-Instruct, LLaDA-1.5), run natively.

A LLaDA network is a LLaMA-style transformer with bidirectional attention: RMSNorm before attention and
MLP, RoPE, a SiLU-gated MLP, no biases. Its released remote code (``modeling_llada.py``, an OLMo
descendant) names the weights its own way; codila never runs that code. It maps the config onto
models/native.py's network (``NativeConfig`` kind "llada": the same maths, tested against the official
class to 1e-5 in tests/test_llada.py) and renames the tensors as they load.

Unlike Dream, LLaDA predicts each token at its own position: the raw output at i is the distribution of
token i: its row says ``shifted=False``, so models/dream.py's denoiser (the same call surface) returns its
raw logits unshifted (Dream's shift stays in models/dream.py, the one place it happens).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from codila_cli.errors import ModelLoadError
from codila_cli.models.dream import DreamDenoiser  # the same call surface; only the shift differs
from codila_cli.models.llada_layout import unsupported


def load_llada(path: Path, cfg: dict, *, name: str, device: Any, dtype: Any, quantize: str = "none") -> DreamDenoiser:
    """A LLaDA checkpoint (safetensors, its own tensor names, no remote code) on models/native.py."""
    from codila_cli.models.loading import LoadedCheckpoint, build_model
    from codila_cli.models.tokens import load_tokenizer, resolve_special_tokens

    problem = unsupported(cfg)
    if problem is not None:
        raise ModelLoadError(f"'{name}' is a LLaDA model with {problem}, which codila does not run",
                             hint="LLaDA-8B-Base/-Instruct and LLaDA-1.5 are supported (docs/models.md)")
    tokenizer = load_tokenizer(path, name=name, native=True)
    specials = resolve_special_tokens(tokenizer, cfg, require_mask=True, name=name)
    model = build_model(cfg, name=name, path=path, device=device, dtype=dtype, causal=False, quantize=quantize, engine="native")
    return DreamDenoiser(LoadedCheckpoint(name, path, cfg, model, tokenizer, specials, device, dtype, quantize), FAMILY)


def _family() -> Any:
    from codila_cli.models.families import Family

    return Family("llada", ("llada",), ("llada", "dream", "threshold", "codila"), infill="shrink only (no <|expand|>)",
                  plan=True, codila=True, cache="Fast-dLLM's (prefix, dual)", licence="MIT (LLaDA-8B-Base/-Instruct, LLaDA-1.5)",
                  note="its own 126k vocabulary: a helper is bridged by token strings (models/token_map.py)",
                  aligns=True, native_only=True, network="llada", load=load_llada)


FAMILY = _family()  # models/families.py reads this row
