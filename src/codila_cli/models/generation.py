"""A checkpoint's own decoding defaults: its ``generation_config.json``, read the way transformers
applies one by default (``generate`` starts from the model's generation config; call arguments win).

In codila the layers are: flag > ``CODILA_*`` > config.toml > the AR helper's recommendation > the
DLM's generation_config.json > built-in default (codila_cli.resolve). Keys read, with Dream's names:
``max_new_tokens``, ``steps``, ``alg``, ``temperature``, ``top_p``, ``top_k``; ``do_sample: false``
means greedy (temperature 0), as in transformers. A value of the wrong type or out of range is ignored
(and named in :func:`generation_defaults`'s second result). No torch, no transformers: the JSON only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ALGS = ("origin", "maskgit_plus", "topk_margin", "entropy")


def _valid(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if key in ("max_new_tokens", "steps", "top_k"):
        return isinstance(value, int) and value > 0
    if key == "alg":
        return value in ALGS
    if key == "temperature":
        return isinstance(value, (int, float)) and value >= 0
    if key == "top_p":
        return isinstance(value, (int, float)) and 0 < value < 1  # 1.0 is no filter
    return False


def generation_defaults(path: Path) -> tuple[dict[str, Any], list[str]]:
    """(the decoding defaults of the checkpoint directory ``path``, the keys ignored as invalid)."""
    file = path / "generation_config.json"
    try:
        raw = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    except (OSError, ValueError):
        return {}, ["generation_config.json (unreadable)"]
    if not isinstance(raw, dict):
        return {}, ["generation_config.json (not an object)"]
    out: dict[str, Any] = {}
    ignored = []
    for key in ("max_new_tokens", "steps", "alg", "temperature", "top_p", "top_k"):
        if key in raw and raw[key] is not None:
            if _valid(key, raw[key]):
                out[key] = float(raw[key]) if key in ("temperature", "top_p") else raw[key]
            else:
                ignored.append(f"{key}={raw[key]!r}")
    if raw.get("do_sample") is False:
        out["temperature"] = 0.0
    return out, ignored


def dlm_generation_defaults(name: str) -> dict[str, Any]:
    """The defaults of the DLM ``name`` (alias, repo id, directory, bundled); {} when it cannot be
    resolved here (loading reports that) or has no generation_config.json."""
    from codila_cli.errors import CodilaError
    from codila_cli.models.cache import resolve_local_dir
    from codila_cli.models.registry import resolve_spec

    try:
        return generation_defaults(resolve_local_dir(resolve_spec(name, kind="dlm")))[0]
    except CodilaError:
        return {}


def task_sampling(name: str, *, temperature: float | None, top_p: float | None,
                  algs: tuple[str, ...] = ("maskgit_plus", "topk_margin", "entropy")) -> tuple[dict[str, Any], dict[str, str]]:
    """``codila infill`` / ``plan``'s sampling: each of temperature, top_p, top_k and alg from the flag
    when given, else the DLM's generation_config.json, else the built-in default (greedy, no filter,
    entropy); returns (values, where each came from: "flag", "generation_config.json" or "default").
    An alg the task's sampler lacks (``origin`` for infill) is left at the default."""
    own = dlm_generation_defaults(name)
    built_in = {"temperature": 0.0, "top_p": None, "top_k": None, "alg": "entropy"}
    given = {"temperature": temperature, "top_p": top_p}
    values, sources = {}, {}
    for key, default in built_in.items():
        if given.get(key) is not None:
            values[key], sources[key] = given[key], "flag"
        elif key in own and (key != "alg" or own[key] in algs):
            values[key], sources[key] = own[key], "generation_config.json"
        else:
            values[key], sources[key] = default, "default"
    return values, sources
