"""The generation decoders, in one place: their names (decoding/config.py::GEN_DECODERS: ``--decoder``'s
choices, eval's settings, the error that lists them) and each one's config class (what it reads:
decoding/knobs.py). A family row names the decoders that run it (models/families.py); engine/generate.py
dispatches on these names."""

from __future__ import annotations

from codila_cli.decoding.config import GEN_DECODERS


def decoder_configs() -> dict[str, type]:
    """Each generation decoder's config class, in :data:`GEN_DECODERS` order."""
    from codila_cli.decoding.block import BlockConfig
    from codila_cli.decoding.config import CodilaConfig, DreamConfig, ThresholdConfig
    from codila_cli.decoding.llada import LladaConfig

    classes = {"dream": DreamConfig, "threshold": ThresholdConfig, "codila": CodilaConfig, "llada": LladaConfig,
               "block": BlockConfig}
    return {name: classes[name] for name in GEN_DECODERS}
