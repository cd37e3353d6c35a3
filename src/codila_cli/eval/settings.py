"""Compact decoder settings for sweeps: ``dream:K=4``, ``threshold:0.9``, ``codila:B=4,tau=0.5``.

Grammar: ``DECODER[:ARGS]`` with ARGS a comma list of ``key=value`` (or a bare number for threshold).
Infill: ``dreamon:K=1``, ``dreamon:tau=0.5`` (CoDiLA on DreamOn marginals), keys K/n0/max/tau/B/exp (expand budget).
Keys: dream K/steps/alg; threshold t (threshold)/block/cache/conv (codila or fast-dllm)/esteps (Fast-dLLM's cached entropy mode); codila B/tau/W/P (parallel blocks)/cond/verify/cache/cb (cache window, blocks)/ctx (AR left context)/arT (AR temperature)/rp (AR repetition penalty).
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


KEYS: dict[str, tuple[str, ...]] = {  # the keys each decoder takes, in the order the docs list them
    "dream": ("K", "steps", "alg"),
    "threshold": ("t", "block", "cache", "conv", "esteps"),
    "codila": ("B", "tau", "W", "P", "cond", "verify", "cache", "cb", "ctx", "arT", "rp", "sg", "ng"),
    "dreamon": ("K", "n0", "max", "tau", "B", "exp"),
}


_SHORT = {"block_size": "B", "candidate_blocks": "W", "ar_context": "ctx", "ar_repetition_penalty": "rp"}


def recommended_label(recommended: dict) -> str:
    """The setting `codila gen` runs by default with a helper that recommends ``recommended``
    (engine.recommend.recommended_decoding), spelled out: {"candidate_blocks": 1, "ar_context": 96, …} ->
    "codila:B=4,W=1,ctx=96,rp=1.3"; a recommended cache adds ``cache=…`` and its window ``cb=…``
    ("…,rp=1.3,cache=dual,cb=4"); ``cache_blocks`` alone is left out (it applies only with a cache)."""
    parts = [f"B={recommended.get('block_size', 4)}"]
    parts += [f"{short}={recommended[k]}" for k, short in _SHORT.items() if k in recommended and k != "block_size"]
    if recommended.get("conditioning", "soft") != "soft":
        parts.append(f"cond={recommended['conditioning']}")
    if recommended.get("ar_syntax_guard"):
        parts.append("sg=1")
    if recommended.get("ar_no_repeat_ngram"):
        parts.append(f"ng={recommended['ar_no_repeat_ngram']}")
    if recommended.get("cache", "none") != "none":
        parts.append(f"cache={recommended['cache']}")
        if "cache_blocks" in recommended:
            parts.append(f"cb={recommended['cache_blocks']}")
    return "codila:" + ",".join(parts)


def parse_setting(text: str, *, max_new_tokens: int, sampling: SamplingConfig | None = None) -> Setting:
    """``DECODER[:key=value,…]`` -> Setting. An unknown decoder or key, a key given twice or a value of the
    wrong type is a ValueError naming the setting (a misspelt key must not run the default silently
    under the misspelt label)."""
    sampling = sampling or SamplingConfig()
    name, _, args = text.strip().partition(":")
    if name not in KEYS:
        raise ValueError(f"unknown decoder {name!r} in setting {text!r}; use one of {', '.join(KEYS)}")
    kv: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in args.split(","))):
        k, eq, v = part.partition("=")
        if not eq:
            k, v = ("t" if name == "threshold" else k), k
        k, v = k.strip(), v.strip()
        if k not in KEYS[name]:
            raise ValueError(f"unknown key {k!r} in setting {text!r}; {name} takes {', '.join(KEYS[name])}")
        if k in kv:
            raise ValueError(f"key {k!r} is given twice in setting {text!r}")
        kv[k] = v

    def num(key: str, kind: type, default: Any = None) -> Any:
        if key not in kv:
            return default
        try:
            return kind(kv[key])
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise ValueError(f"{key} must be {what} in setting {text!r}, got {kv[key]!r}") from None

    try:
        return Setting(text.strip(), name, _config(name, kv, num, max_new_tokens, sampling))
    except ValueError as exc:
        msg = str(exc)
        raise ValueError(msg if repr(text) in msg else f"{msg} (setting {text!r})") from None


def _config(name: str, kv: dict[str, str], num: Any, max_new_tokens: int, sampling: SamplingConfig) -> Any:
    """The decoder's configuration dataclass from parsed keys (its own validation raises ValueError)."""
    common = {"max_new_tokens": max_new_tokens, "sampling": sampling}
    if name == "dream":
        cfg: Any = DreamConfig(tokens_per_step=num("K", int), steps=num("steps", int), alg=kv.get("alg", "entropy"),
                               **common)
    elif name == "threshold":
        cfg = ThresholdConfig(threshold=num("t", float, 0.9), block_length=num("block", int, 32),
                              cache=kv.get("cache", "none"), convention=kv.get("conv", "codila"),
                              entropy_steps=num("esteps", int), **common)
    elif name == "codila":
        for flag in ("verify", "sg"):
            if kv.get(flag, "0") not in ("0", "1"):
                raise ValueError(f"{flag} must be 0 or 1, got {kv[flag]!r}")
        cfg = CodilaConfig(block_size=num("B", int, 4), tau=num("tau", float), candidate_blocks=num("W", int, 10),
                           parallel_blocks=num("P", int, 1), conditioning=kv.get("cond", "soft"),
                           ar_verify=kv.get("verify") == "1", cache=kv.get("cache", "none"),
                           ar_context=num("ctx", int, 0), cache_blocks=num("cb", int),
                           ar_temperature=num("arT", float, 0.0), ar_repetition_penalty=num("rp", float, 1.0),
                           ar_syntax_guard=kv.get("sg") == "1", ar_no_repeat_ngram=num("ng", int, 0), **common)
    else:
        cfg = InfillConfig(tokens_per_step=num("K", int, 1), initial_masks=num("n0", int, 4),
                           max_middle_tokens=num("max", int, max_new_tokens), tau=num("tau", float),
                           expand_budget=num("exp", int),
                           block_size=num("B", int, 4), sampling=sampling)
    return cfg
