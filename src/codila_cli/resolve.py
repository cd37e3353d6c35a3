"""What ``codila gen`` runs, from its layered settings: flag > ``CODILA_*`` environment variable (Typer
reads those into the flags) > config.toml > the AR helper's recommendation > built-in default.

:func:`resolve_gen` picks the models and the decoder and builds every decoder's frozen config (so a bad
``--block-size`` is an error even when ``dream`` runs); nothing here loads a model or prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from codila_cli.config import UserConfig
from codila_cli.errors import UsageError

GEN_DEFAULTS: dict[str, Any] = {
    "decoder": "auto", "max_new_tokens": 128, "steps": None, "tokens_per_step": None, "alg": "entropy",
    "temperature": 0.0, "top_p": None, "top_k": None, "block_length": 32, "threshold": 0.9, "block_size": 4,
    "tau": None, "candidate_blocks": 10, "parallel_blocks": 1, "conditioning": "soft", "ar_temperature": 0.0,
    "ar_context": 0, "ar_repetition_penalty": 1.0, "device": "auto", "dtype": "auto", "cache": "none",
    "cache_blocks": None,
}
RUNTIME_KEYS = ("device", "dtype")  # config.toml [runtime]; every other key lives in [gen]


@dataclass(frozen=True)
class GenRequest:
    """One resolved ``codila gen``: the models to load, the decoder and its config, device and dtype."""

    decoder: str
    config: Any  # DreamConfig | ThresholdConfig | CodilaConfig
    dlm: str
    ar: str | None  # loaded only for the codila decoder
    device: str
    dtype: str


class Layers:
    """Looks one key up through the layers; the helper's recommendation is filled in once it is known."""

    def __init__(self, flags: Mapping[str, Any], user: UserConfig) -> None:
        self.flags, self.user, self.recommended = flags, user, {}

    def given(self, key: str) -> Any:
        """The first value set by a flag, the environment, the config file or the recommendation; else None."""
        value = self.flags.get(key)
        if isinstance(value, Enum):
            value = value.value
        if value is None:
            value = self.user.get("runtime" if key in RUNTIME_KEYS else "gen", key)
        return self.recommended.get(key) if value is None else value

    def __call__(self, key: str) -> Any:
        value = self.given(key)
        return GEN_DEFAULTS.get(key) if value is None else value


def resolve_gen(flags: Mapping[str, Any], *, user: UserConfig, dlm: str | None, ar: str | None,
                alg_temp: float | None = None, ar_verify: bool = False, verify_penalty: float = 0.5,
                stop: tuple[str, ...] = (), early_stop: bool = True) -> GenRequest:
    """``flags`` holds the layered options by GEN_DEFAULTS key (None = not given); ``dlm``/``ar`` the
    ``--dlm``/``--ar`` flags (config ``[models]`` and the bundled pair fill them in)."""
    from codila_cli.decoding.config import CodilaConfig, DreamConfig, SamplingConfig, ThresholdConfig
    from codila_cli.runtime import default_ar, default_dlm, recommended_decoding

    opt = Layers(flags, user)
    dlm_name = dlm or user.get("models", "dlm") or default_dlm()
    ar_name = ar or user.get("models", "ar") or (default_ar() if dlm_name == "bundled-dlm" else None)
    chosen = opt("decoder")
    if chosen not in ("auto", "dream", "threshold", "codila"):
        raise UsageError(f"invalid decoder {chosen!r} in {user.path}", hint="use auto, dream, threshold or codila")
    if chosen == "auto":
        chosen = "codila" if ar_name else "dream"
    if chosen == "codila" and not ar_name:
        raise UsageError("--decoder codila needs an AR helper", hint="pass --ar qwen3-0.6b (or bundled-ar)")
    if chosen == "codila":
        opt.recommended.update(recommended_decoding(ar_name))
        if opt("cache") == "none":  # a recommended cache window is for when a cache is on
            opt.recommended.pop("cache_blocks", None)
    sampling = SamplingConfig(temperature=opt("temperature"), top_p=opt("top_p"), top_k=opt("top_k"))
    alg_name = opt("alg")
    # the helper writes CoDiLA's tokens, so it samples at --temperature unless told otherwise
    ar_temperature = opt("temperature") if opt.given("ar_temperature") is None else opt.given("ar_temperature")
    common = {"max_new_tokens": opt("max_new_tokens"), "sampling": sampling, "early_stop": early_stop, "stop": stop}
    configs: dict[str, Any] = {
        "dream": DreamConfig(steps=opt("steps"), tokens_per_step=opt("tokens_per_step"), alg=alg_name,
                             alg_temp=alg_temp, **common),
        "threshold": ThresholdConfig(block_length=opt("block_length"), threshold=opt("threshold"),
                                     cache=opt("cache"), **common),
        "codila": CodilaConfig(block_size=opt("block_size"), tau=opt("tau"), candidate_blocks=opt("candidate_blocks"),
                               parallel_blocks=opt("parallel_blocks"), conditioning=opt("conditioning"),
                               ar_temperature=ar_temperature, ar_context=opt("ar_context"),
                               ar_repetition_penalty=opt("ar_repetition_penalty"), ar_verify=ar_verify,
                               verify_penalty=verify_penalty, alg=alg_name if alg_name != "origin" else "entropy",
                               cache=opt("cache") if chosen == "codila" else "none",
                               cache_blocks=opt("cache_blocks") if chosen == "codila" else None, **common),
    }
    if chosen == "dream" and opt("cache") != "none":
        raise UsageError("--cache needs a block decoder", hint="use --decoder threshold or --decoder codila")
    return GenRequest(decoder=chosen, config=configs[chosen], dlm=dlm_name, ar=ar_name if chosen == "codila" else None,
                      device=opt("device"), dtype=opt("dtype"))
