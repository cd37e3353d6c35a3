"""The diffusion-model families codila runs, what each supports, and the one loader that picks the family
from a checkpoint's ``model_type`` (models/dream.py, models/llada.py). ``codila models`` prints the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.json's model_type, lower case
    decoders: tuple[str, ...]  # --decoder values that run it (the first is its own sampler)
    infill: str  # codila infill: expand/delete needs the model's <|expand|> token (DreamOn); else shrink only
    plan: bool  # codila plan (SDDC)
    codila: bool  # CoDiLA with an AR helper (a helper sharing its vocabulary)
    cache: str  # the KV cache: "approximate (prefix, dual)", "none", "exact"
    licence: str
    note: str = ""


FAMILIES: tuple[Family, ...] = (
    Family("dream", ("dream",), ("dream", "threshold", "codila"), infill="expand/delete (DreamOn)", plan=True, codila=True,
           cache="approximate (prefix, dual)", licence="Apache-2.0 (Dream-Coder, DreamOn)",
           note="Dream-Coder, DreamOn (infill), DiffuCoder; Qwen2.5 vocabulary: Qwen3 helpers need no bridge"),
    Family("llada", ("llada",), ("llada", "dream", "threshold", "codila"), infill="shrink only (no <|expand|>)",
           plan=True, codila=True,
           cache="Fast-dLLM's (prefix, dual)", licence="MIT (LLaDA-8B-Base/-Instruct, LLaDA-1.5)",
           note="its own 126k vocabulary: a helper is bridged by token strings (models/token_map.py)"),
    Family("sdar", ("sdar",), ("block", "codila"), infill="no", plan=False, codila=True,
           cache="exact (committed blocks)", licence="Apache-2.0 (SDAR-1.7B-Chat)",
           note="block diffusion on Qwen3's network and vocabulary: a Qwen3 helper needs no bridge"),
)


def family_of(cfg: dict) -> Family | None:
    kind = str(cfg.get("model_type", "")).lower()
    return next((f for f in FAMILIES if kind in f.model_types), None)


def load_dlm(path: Path, *, name: str, device: Any, dtype: Any, quantize: str = "none") -> Any:
    """The diffusion LM in ``path``, by its family: Dream (models/dream.py) or LLaDA (models/llada.py)."""
    from codila_cli.errors import ModelLoadError
    from codila_cli.models.loading import read_config

    cfg = read_config(path, name=name)
    family = family_of(cfg)
    if family is not None and family.name == "llada":
        from codila_cli.models.llada import load_llada

        return load_llada(path, cfg, name=name, device=device, dtype=dtype, quantize=quantize)
    if family is not None and family.name == "sdar":
        from codila_cli.models.sdar import load_sdar

        return load_sdar(path, cfg, name=name, device=device, dtype=dtype, quantize=quantize)
    if family is None:
        raise ModelLoadError(
            f"'{name}' is a '{cfg.get('model_type')}' model, not a diffusion model codila runs",
            hint="use --dlm with a Dream, LLaDA or SDAR checkpoint (`codila models` lists the families), e.g. "
                 "dream-coder or bundled-dlm",
        )
    from codila_cli.models.dream import load_dream

    return load_dream(path, cfg, name=name, device=device, dtype=dtype, quantize=quantize)
