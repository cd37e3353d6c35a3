"""A checkpoint's own decoding defaults: its ``generation_config.json``, read the way transformers
applies one by default (``generate`` starts from the model's generation config; call arguments win).

In codila the layers are: flag > ``CODILA_*`` > config.toml > the AR helper's recommendation > the
DLM's generation_config.json > built-in default (codila_cli.resolve). Keys read: the knobs the table
marks ``model`` (decoding/config.py; Dream's names: the length, steps, alg and the sampling knobs), each
checked against its knob's kind and range; ``do_sample: false`` means greedy (temperature 0), as in
transformers. A value of the wrong type or out of range is ignored (and named in
:func:`generation_defaults`'s second result). No torch, no transformers: the JSON only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def generation_defaults(path: Path) -> tuple[dict[str, Any], list[str]]:
    """(the decoding defaults of the checkpoint directory ``path``, the keys ignored as invalid): each knob
    the table marks ``model`` (decoding/config.py) whose value is of the knob's kind and in its range."""
    from codila_cli.decoding.config import GEN_KNOBS

    file = path / "generation_config.json"
    try:
        raw = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
    except (OSError, ValueError):
        return {}, ["generation_config.json (unreadable)"]
    if not isinstance(raw, dict):
        return {}, ["generation_config.json (not an object)"]
    out: dict[str, Any] = {}
    ignored = []
    for knob in GEN_KNOBS.values():
        value = raw.get(knob.name) if knob.model else None
        if value is None:
            continue
        if knob.in_range(value):
            out[knob.name] = float(value) if knob.kind is float else value
        else:
            ignored.append(f"{knob.name}={value!r}")
    if raw.get("do_sample") is False:  # transformers' switch for greedy decoding
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


def task_sampling(name: str, given: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """``codila infill`` / ``plan``'s sampling: each infill knob the table marks ``model`` (the sampling
    knobs and alg) from ``given`` (the flags; None = not given), else the DLM's generation_config.json when
    infill can run its value, else the table's default; returns (values, where each came from: "flag",
    "generation_config.json" or "default"). ``origin``, an alg infill lacks, stays at the default."""
    from codila_cli.decoding.config import INFILL_KNOBS

    own = dlm_generation_defaults(name)
    values, sources = {}, {}
    for knob in INFILL_KNOBS.values():
        if not knob.model:
            continue
        key = knob.name
        if given.get(key) is not None:
            values[key], sources[key] = given[key], "flag"
        elif key in own and knob.in_range(own[key]):
            values[key], sources[key] = own[key], "generation_config.json"
        else:
            values[key], sources[key] = knob.default, "default"
    return values, sources
