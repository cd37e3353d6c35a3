"""The diffusion-model families codila runs: the registry every other module reads.

A family is one module of ``codila_cli.models`` (listed in :data:`MODULES`) that defines ``FAMILY``, a
:class:`Family` row: how a checkpoint is recognised, its loader, what its network is, which decoders run
it, what ``infill``/``plan``/CoDiLA/caches support, and its licence. Nothing else in codila names a family:
the loader, the decoders' dispatch, ``codila models``, the server's ``/health`` and ``/api/tags``, and
``train align`` ask the row. Adding a family is its module, its line here, and its goldens
(tests/test_stable_diffcoder.py::test_a_family_is_one_module holds codila to that).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

# the family modules, in the order `codila models` lists them
MODULES = ("dream", "llada", "sdar", "stable_diffcoder")
VERIFIED = "token-identical to the official code on goldens (tests/)"  # a row says otherwise where less holds


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.json's model_type, lower case
    decoders: tuple[str, ...]  # --decoder values that run it (the first is its own sampler)
    infill: str  # codila infill: expand/delete needs the model's <|expand|> token (DreamOn); else shrink only; "no"
    plan: bool  # codila plan (SDDC)
    codila: bool  # CoDiLA with an AR helper (a helper sharing its vocabulary, or bridged by token strings)
    cache: str  # the KV cache: "approximate (prefix, dual)", "none", "exact"
    licence: str
    note: str = ""
    # a model_type several families share (llama): the config must also name one of these in its
    # ``architectures`` or ``auto_map`` (case-insensitive substrings)
    markers: tuple[str, ...] = ()
    block_diffusion: bool = False  # written block by block against an exact cache (decoding/block.py)
    block_rules: Any = field(default=None, compare=False)  # its block sampler's rules (decoding/block.py::BlockRules)
    native_only: bool = False  # runs on models/native.py only (transformers has no class that runs it right)
    aligns: bool = False  # `codila train align` trains a helper on it (whole-canvas denoisers)
    context: int | None = None  # the usable context (prompt + output) when less than the config's
    helper_cache: bool = False  # CoDiLA's approximate KV cache runs it (a helper's recommended cache applies)
    # its network's architecture, as transformers and models/native.py name it (qwen2, qwen3, llama, llada):
    # what builds it; None: its model_type
    network: str | None = None
    shifted: bool = False  # the network's raw output at i predicts token i + 1 (Dream's): models/dream.py shifts it
    verified: str = VERIFIED
    load: Callable[..., Any] | None = field(default=None, compare=False, repr=False)
    trained_block: Callable[[dict, Any], int | None] | None = field(default=None, compare=False, repr=False)

    def claims(self, cfg: dict) -> bool:
        """Whether a checkpoint with config.json ``cfg`` belongs to this family."""
        if str(cfg.get("model_type", "")).lower() not in self.model_types:
            return False
        if not self.markers:
            return True
        names = [*(cfg.get("architectures") or []), *(v for v in (cfg.get("auto_map") or {}).values() if isinstance(v, str))]
        return any(m.lower() in str(n).lower() for m in self.markers for n in names)

    def block_of(self, cfg: dict, path: Any = None) -> int | None:
        """The block size the checkpoint was trained with (block-diffusion families), else None."""
        return self.trained_block(cfg, path) if self.trained_block is not None else None


@cache
def families() -> tuple[Family, ...]:
    """Every family row, in :data:`MODULES` order."""
    from importlib import import_module

    return tuple(import_module(f"codila_cli.models.{m}").FAMILY for m in MODULES)


def family_of(cfg: dict) -> Family | None:
    """The family a checkpoint's config.json ``cfg`` belongs to, or None (an AR model, an unknown DLM); the
    rows that need a marker (a model_type several families share) are asked first."""
    return next((f for f in sorted(families(), key=lambda f: not f.markers) if f.claims(cfg)), None)


def network_type(cfg: dict) -> str:
    """The architecture of a checkpoint's network (what transformers and models/native.py build): its
    family's ``network``, else its own ``model_type`` (an AR helper's qwen2/qwen3/llama)."""
    family = family_of(cfg)
    return (family and family.network) or str(cfg.get("model_type", "")).lower()


def load_dlm(path: Path, *, name: str, device: Any, dtype: Any, quantize: str = "none") -> Any:
    """The diffusion LM in ``path``, by its family's loader; the denoiser carries its row (``.family``)."""
    from codila_cli.errors import ModelLoadError
    from codila_cli.models.validate import read_config

    cfg = read_config(path, name=name)
    family = family_of(cfg)
    if family is None or family.load is None:
        names = ", ".join(f.name for f in families())
        raise ModelLoadError(
            f"'{name}' is a '{cfg.get('model_type')}' model, not a diffusion model codila runs",
            hint=f"use --dlm with a checkpoint of a family codila runs ({names}; `codila models` lists them), "
                 "e.g. dream-coder or bundled-dlm",
        )
    dlm = family.load(path, cfg, name=name, device=device, dtype=dtype, quantize=quantize)
    dlm.family = family
    return dlm
