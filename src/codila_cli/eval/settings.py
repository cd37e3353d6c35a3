"""Compact decoder settings for sweeps: ``dream:K=4``, ``threshold:0.9``, ``codila:B=4,tau=0.5``.

Grammar: ``DECODER[:ARGS]`` with ARGS a comma list of ``key=value`` (or a bare number for threshold).
Infill: ``dreamon:K=1``, ``dreamon:tau=0.5`` (CoDiLA on DreamOn marginals). The keys are the knobs' eval
keys (``Knob.short`` in decoding/config.py; docs/settings.md lists them), read into the decoder's config
with the table's defaults: ``codila:B=4`` means the library defaults, never a helper's recommendation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from codila_cli.decoding.config import (
    GEN_KNOBS,
    INFILL_KNOBS,
    InfillConfig,
    SamplingConfig,
)
from codila_cli.decoding.knobs import Knob, KnobTable, build, inert, knob_fields, label_parts
from codila_cli.decoding.registry import decoder_configs

INFILL_GRID = ["dreamon:K=1", "dreamon:K=2", "dreamon:tau=0.2", "dreamon:tau=0.5"]
PAPER_GRID = ["dream:K=1", "dream:K=2", "dream:K=4", "dream:K=8", "threshold:0.9",
              "codila:B=2", "codila:B=4", "codila:B=8", "codila:B=4,tau=0.1", "codila:B=4,tau=0.5",
              "codila:B=4,tau=1.0"]
EXAMPLES = ("dream:K=4", "threshold:0.9", "codila:B=4,tau=0.5")  # what `codila eval --help` shows
LENGTH = {False: GEN_KNOBS.default("max_new_tokens"), True: INFILL_KNOBS.default("max_middle_tokens")}  # eval's length by infill


@dataclass(frozen=True)
class Setting:
    label: str
    decoder: str
    config: Any


CONFIGS: dict[str, tuple[type, KnobTable]] = {  # each decoder's config and the table its keys come from
    **{name: (cls, GEN_KNOBS) for name, cls in decoder_configs().items()},  # decoding/registry.py
    "dreamon": (InfillConfig, INFILL_KNOBS),
}
_OWN = ("max_new_tokens", "temperature", "top_p", "top_k")  # from eval's own flags, not keys


def _keys(decoder: str) -> dict[str, Knob]:
    """A decoder's setting keys (the knobs of its config with an eval key), in table order."""
    cls, table = CONFIGS[decoder]
    names = set(knob_fields(cls))
    return {k.short: k for k in table.values() if k.short and k.name in names and k.name not in _OWN}


KEYS: dict[str, tuple[str, ...]] = {d: tuple(_keys(d)) for d in CONFIGS}  # the keys each decoder takes


def recommended_label(recommended: dict) -> str:
    """The setting `codila gen` runs by default with a helper that recommends ``recommended``
    (helper_card.recommended_decoding), spelled out in table order with the knobs' eval keys
    ("codila:B=4,W=1,ctx=96,rp=1.3"); a cache window is left out without a cache (it applies only with one)."""
    values = {"block_size": GEN_KNOBS.default("block_size"), **recommended}
    for name in inert(GEN_KNOBS, values):
        values.pop(name, None)
    return "codila:" + ",".join(label_parts(GEN_KNOBS, values))


def parse_setting(text: str, *, max_new_tokens: int, sampling: SamplingConfig | None = None) -> Setting:
    """``DECODER[:key=value,…]`` -> Setting. An unknown decoder or key, a key given twice or a value of the
    wrong type is a ValueError naming the setting (a misspelt key must not run the default silently
    under the misspelt label)."""
    sampling = sampling or SamplingConfig()
    name, _, args = text.strip().partition(":")
    if name not in CONFIGS:
        raise ValueError(f"unknown decoder {name!r} in setting {text!r}; use one of {', '.join(CONFIGS)}")
    keys = _keys(name)
    given: dict[str, Any] = {}
    try:
        for part in filter(None, (p.strip() for p in args.split(","))):
            k, eq, v = part.partition("=")
            if not eq:
                k, v = ("t" if name == "threshold" else k), k
            k, v = k.strip(), v.strip()
            if k not in keys:
                raise ValueError(f"unknown key {k!r} in setting {text!r}; {name} takes {', '.join(keys)}")
            if keys[k].name in given:
                raise ValueError(f"key {k!r} is given twice in setting {text!r}")
            given[keys[k].name] = keys[k].parse(v, key=k, where=f" in setting {text!r}")
        cls, table = CONFIGS[name]
        own = {"max_new_tokens": max_new_tokens, "max_middle_tokens": max_new_tokens}
        config = build(cls, lambda n: given.get(n, own.get(n, table.default(n))), sampling=sampling)
        return Setting(text.strip(), name, config)
    except ValueError as exc:
        msg = str(exc)
        raise ValueError(msg if repr(text) in msg else f"{msg} (setting {text!r})") from None
