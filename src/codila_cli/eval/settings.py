"""Compact decoder settings for sweeps: ``dream:K=4``, ``threshold:0.9``, ``codila:B=4,tau=0.5``.

Grammar: ``DECODER[:ARGS]`` with ARGS a comma list of ``key=value`` (or a bare number for threshold).
Infill: ``dreamon:K=1``, ``dreamon:tau=0.5`` (CoDiLA on DreamOn marginals), keys K/n0/max/tau/B.
Keys: dream K/steps/alg; threshold t (threshold)/block/cache; codila B/tau/W/P (parallel blocks)/cond/verify/cache/cb (cache window, blocks)/ctx (AR left context)/arT (AR temperature)/rp (AR repetition penalty).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from codila_cli.decoding.config import CodilaConfig, DreamConfig, InfillConfig, SamplingConfig, ThresholdConfig

INFILL_GRID = ["dreamon:K=1", "dreamon:K=2", "dreamon:tau=0.2", "dreamon:tau=0.5"]
PAPER_GRID = ["dream:K=1", "dream:K=2", "dream:K=4", "dream:K=8", "threshold:0.9",
              "codila:B=2", "codila:B=4", "codila:B=8", "codila:B=4,tau=0.1", "codila:B=4,tau=0.5",
              "codila:B=4,tau=1.0"]


@dataclass(frozen=True)
class Setting:
    label: str
    decoder: str
    config: Any


def parse_setting(text: str, *, max_new_tokens: int, sampling: SamplingConfig | None = None) -> Setting:
    sampling = sampling or SamplingConfig()
    name, _, args = text.strip().partition(":")
    kv: dict[str, str] = {}
    for part in filter(None, args.split(",")):
        k, eq, v = part.partition("=")
        if not eq:
            k, v = ("t" if name == "threshold" else k), k
        kv[k.strip()] = v.strip()
    common = {"max_new_tokens": max_new_tokens, "sampling": sampling}
    try:
        if name == "dream":
            cfg: Any = DreamConfig(tokens_per_step=int(kv["K"]) if "K" in kv else None,
                                   steps=int(kv["steps"]) if "steps" in kv else None,
                                   alg=kv.get("alg", "entropy"), **common)
        elif name == "threshold":
            cfg = ThresholdConfig(threshold=float(kv.get("t", 0.9)), block_length=int(kv.get("block", 32)),
                                  cache=kv.get("cache", "none"), **common)
        elif name == "codila":
            cfg = CodilaConfig(block_size=int(kv.get("B", 4)), tau=float(kv["tau"]) if "tau" in kv else None,
                               candidate_blocks=int(kv.get("W", 10)), parallel_blocks=int(kv.get("P", 1)),
                               conditioning=kv.get("cond", "soft"), ar_verify=kv.get("verify") == "1",
                               cache=kv.get("cache", "none"), ar_context=int(kv.get("ctx", 0)),
                               cache_blocks=int(kv["cb"]) if "cb" in kv else None,
                               ar_temperature=float(kv.get("arT", 0.0)),
                               ar_repetition_penalty=float(kv.get("rp", 1.0)), **common)
        elif name == "dreamon":
            cfg = InfillConfig(tokens_per_step=int(kv.get("K", 1)), initial_masks=int(kv.get("n0", 4)),
                               max_middle_tokens=int(kv.get("max", max_new_tokens)),
                               tau=float(kv["tau"]) if "tau" in kv else None, block_size=int(kv.get("B", 4)),
                               sampling=sampling)
        else:
            raise ValueError(f"unknown decoder {name!r} in setting {text!r}")
    except (KeyError, TypeError) as exc:
        raise ValueError(f"bad setting {text!r}: {exc}") from exc
    return Setting(text.strip(), name, cfg)
