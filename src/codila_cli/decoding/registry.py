"""The generation decoders, in one place: their names (decoding/config.py::GEN_DECODERS: ``--decoder``'s
choices, eval's settings, the error that lists them), each one's config class (what it reads:
decoding/knobs.py) and its sampler. A family row names the decoders that run it (models/families.py);
engine/generate.py runs the one a row allows through :func:`sampler`."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module

from codila_cli.decoding.config import GEN_DECODERS

# each decoder's sampler (module of codila_cli.decoding, function), called as
# ``fn(dlm, prompt_ids, config=, generator=, on_step=[, writer=])``; on a block-diffusion model (a family row
# with ``block_diffusion``) CoDiLA writes inside its blocks instead
SAMPLERS = {"dream": ("dream", "decode_dream"), "threshold": ("threshold", "decode_threshold"),
            "codila": ("codila", "decode_codila"), "llada": ("llada", "decode_llada"), "block": ("block", "decode_block")}
BLOCK_SAMPLERS = {**SAMPLERS, "codila": ("block", "decode_block_codila")}
WRITES_WITH_HELPER = ("codila",)  # the decoders that take a ``writer`` (an AR helper: decoding/bridged.py)


def decoder_configs() -> dict[str, type]:
    """Each generation decoder's config class, in :data:`GEN_DECODERS` order."""
    from codila_cli.decoding.block import BlockConfig
    from codila_cli.decoding.config import CodilaConfig, DreamConfig, ThresholdConfig
    from codila_cli.decoding.llada import LladaConfig

    classes = {"dream": DreamConfig, "threshold": ThresholdConfig, "codila": CodilaConfig, "llada": LladaConfig,
               "block": BlockConfig}
    return {name: classes[name] for name in GEN_DECODERS}


def sampler(name: str, *, block_diffusion: bool) -> Callable:
    """The sampler function of decoder ``name`` (one of :data:`GEN_DECODERS`) for a whole-canvas or a
    block-diffusion model."""
    module, function = (BLOCK_SAMPLERS if block_diffusion else SAMPLERS)[name]
    return getattr(import_module(f"codila_cli.decoding.{module}"), function)
