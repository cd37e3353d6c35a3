"""The helper card: what an AR helper's ``config.json`` says about itself to codila, read, written and
validated here only (training writes it, loading, ``gen``, ``eval`` and ``doctor`` read it).

``codila_decoding``: the CoDiLA settings measured best for this helper, the way a
``generation_config.json`` carries a model's sampling defaults. Its keys are the knobs the table marks
recommendable (decoding/config.py::GEN_KNOBS, ``recommend=True``), each with a value in the knob's range;
``by_block_size`` ``{"8": {KEY: value, …}}`` holds settings chosen for one block size, which replace the
general ones when that block size runs. Flags, ``CODILA_*`` variables and config.toml override them.

``codila_training``: provenance, written by ``codila train align`` / ``export``: which DLM the helper was
aligned to (``dlm``: name, repository, revision, path, weights' fingerprint), its data, steps and losses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DECODING, TRAINING = "codila_decoding", "codila_training"
PER_BLOCK = "by_block_size"


@dataclass(frozen=True)
class HelperCard:
    """A helper's card: its valid recommendations, per block size too, and its training record;
    ``problems`` names what the file holds that is not a valid recommendation (ignored)."""

    decoding: dict[str, Any] = field(default_factory=dict)
    by_block_size: dict[int, dict[str, Any]] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def recommended(self, *, block_size: int | None = None) -> dict[str, Any]:
        """The settings that apply when block size ``block_size`` runs (None: the recommended one, else
        the library default): the general ones, then that block size's."""
        from codila_cli.decoding.config import GEN_KNOBS

        out = dict(self.decoding)
        b = block_size if block_size is not None else out.get("block_size", GEN_KNOBS.default("block_size"))
        out.update(self.by_block_size.get(b, {}))
        return out

    @property
    def aligned_dlm(self) -> dict | None:
        """The DLM the helper was aligned to (``codila_training.dlm``), or None when it does not say."""
        dlm = self.training.get("dlm")
        return dlm if isinstance(dlm, dict) else None


def check(key: str, value: Any) -> str | None:
    """Why ``key = value`` is not a recommendation a helper may make, or None when it is one."""
    from codila_cli.decoding.config import GEN_KNOBS

    knob = GEN_KNOBS.recommendable().get(key)
    if knob is None:
        return f"{key} is not a setting a helper may recommend ({', '.join(GEN_KNOBS.recommendable())})"
    if value is None or not knob.in_range(value):
        allowed = knob.range_text() or knob.kind.__name__
        return f"{key}={value!r} is outside its range ({allowed})"
    return None


def _valid(table: Mapping[str, Any], problems: list[str], *, where: str = "") -> dict[str, Any]:
    from codila_cli.decoding.config import GEN_KNOBS

    out = {}
    for key, value in table.items():
        why = "block_size is the key of by_block_size, not one of its settings" if where and key == "block_size" \
            else check(key, value)
        if why:
            problems.append(where + why)
        else:
            out[key] = float(value) if GEN_KNOBS[key].kind is float else value
    return out


def read_card(config: Mapping[str, Any]) -> HelperCard:
    """The card in a parsed config.json; what is not valid is left out and named in ``problems``."""
    problems: list[str] = []
    rec = config.get(DECODING)
    decoding: dict[str, Any] = {}
    per: dict[int, dict[str, Any]] = {}
    if isinstance(rec, Mapping):
        decoding = _valid({k: v for k, v in rec.items() if k != PER_BLOCK}, problems)
        table = rec.get(PER_BLOCK, {"": None})
        if not isinstance(table, Mapping) or not table:
            problems.append(f"{PER_BLOCK} must be a non-empty table of block sizes")
            table = {}
        for b, one in table.items():
            if b == "" and one is None:  # no by_block_size at all
                continue
            if not str(b).isdigit() or int(b) < 1 or not isinstance(one, Mapping):
                problems.append(f"{PER_BLOCK}: {b!r} is not a block size with a table of settings")
                continue
            per[int(b)] = _valid(one, problems, where=f"{PER_BLOCK}.{b}: ")
    elif rec is not None:
        problems.append(f"{DECODING} is not a table")
    training = config.get(TRAINING)
    return HelperCard(decoding, per, dict(training) if isinstance(training, Mapping) else {}, tuple(problems))


def card_of(ar: str) -> HelperCard:
    """The card of the helper ``ar`` (alias, repo id or directory); an empty card when it cannot be read
    (loading reports a missing or broken checkpoint itself)."""
    from codila_cli.errors import CodilaError
    from codila_cli.models.cache import resolve_local_dir
    from codila_cli.models.registry import resolve_spec

    try:
        cfg = json.loads((resolve_local_dir(resolve_spec(ar, kind="ar")) / "config.json").read_text(encoding="utf-8"))
    except (CodilaError, OSError, ValueError):
        return HelperCard()
    return read_card(cfg) if isinstance(cfg, dict) else HelperCard()


def recommended_decoding(ar: str, *, block_size: int | None = None) -> dict[str, Any]:
    """The CoDiLA settings helper ``ar`` recommends for block size ``block_size`` ({} when none)."""
    return card_of(ar).recommended(block_size=block_size)


def validate_decoding(decoding: Mapping[str, Any]) -> dict[str, Any]:
    """A ``codila_decoding`` table to write: every entry valid (``by_block_size`` included), else
    ValueError naming the first that is not."""
    card = read_card({DECODING: dict(decoding)})
    if card.problems:
        raise ValueError(f"not a recommendable CoDiLA setting: {card.problems[0]}")
    out: dict[str, Any] = dict(card.decoding)
    if card.by_block_size:
        out[PER_BLOCK] = {str(b): one for b, one in sorted(card.by_block_size.items())}
    return out


def write_card(config: dict[str, Any], *, decoding: Mapping[str, Any] | None = None,
               training: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``config`` with the card's parts replaced where given: ``decoding`` (validated; {} removes it, as
    a source helper's recommendation was for another helper) and ``training``."""
    out = dict(config)
    if decoding is not None:
        if decoding:
            out[DECODING] = validate_decoding(decoding)
        else:
            out.pop(DECODING, None)
    if training is not None:
        out[TRAINING] = dict(training)
    return out


def read_config(path: Path) -> dict[str, Any]:
    """A checkpoint's config.json (ValueError when it is not a JSON object)."""
    cfg = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(cfg, dict):
        raise ValueError(f"{path} is not a JSON object")  # noqa: TRY004 -- a malformed file, as json.loads raises
    return cfg


def write_config(path: Path, config: Mapping[str, Any]) -> None:
    """config.json written atomically (sorted keys, as every codila-written checkpoint)."""
    import os

    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def parse_pairs(pairs: list[str]) -> dict[str, Any]:
    """``--decoding KEY=VALUE`` (``codila train export``): an int, a float (with a dot), true/false or
    text; ``B8.KEY=VALUE`` recommends it for block size 8 only. ValueError names a bad pair."""
    from codila_cli.decoding.config import GEN_KNOBS

    out: dict[str, Any] = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        scoped = re.fullmatch(r"B([1-9][0-9]*)\.(\w+)", key)
        name = scoped.group(2) if scoped else key
        knob = GEN_KNOBS.recommendable().get(name)
        try:
            value = knob.parse(text) if knob is not None and eq else text
        except ValueError:
            value = text
        why = "give KEY=VALUE" if not eq else check(name, value)
        if why or (scoped and name == "block_size"):
            raise ValueError(f"--decoding {pair!r}: {why or 'block_size cannot be set per block size'}")
        if scoped:
            out.setdefault(PER_BLOCK, {}).setdefault(scoped.group(1), {})[name] = value
        else:
            out[name] = value
    return out


def helper_mismatch(models: object) -> str | None:
    """A warning when the AR helper's config records that it was aligned to another DLM than the one
    loaded (``codila train align`` writes ``codila_training.dlm``); None when it matches or says nothing."""
    from codila_cli.models.cache import identity, same_model
    from codila_cli.models.registry import resolve_spec

    ar, dlm = getattr(models, "ar", None), getattr(models, "dlm", None)
    if ar is None or dlm is None:
        return None
    recorded = read_card(ar.ckpt.config).aligned_dlm
    if recorded is None:
        return None
    current = identity(resolve_spec(dlm.name, kind="dlm"), Path(dlm.ckpt.path))
    if same_model(recorded, current):
        return None
    was = recorded.get("repo_id") or recorded.get("path") or recorded.get("name")
    rev = f"@{recorded['revision'][:12]}" if recorded.get("repo_id") and recorded.get("revision") else ""
    return (f"the AR helper '{ar.name}' was aligned to {was}{rev}, not to the DLM in use ({dlm.name}); "
            "its blocks may be worse than with the DLM it was trained for")


def helper_warnings(models: object) -> list[str]:
    """What to tell the user about the loaded helper before CoDiLA runs (gen, infill, eval): it was aligned
    to another DLM (:func:`helper_mismatch`; not said of the bundled helper with the bundled infill model,
    which is the bundled DLM fine-tuned), and it has other token ids than the DLM, so the pair is made by
    token strings (models/token_map.py::TokenMap), without an alignment to this DLM."""
    bridge, ar, dlm = getattr(models, "bridge", None), getattr(models, "ar", None), getattr(models, "dlm", None)
    if ar is None or dlm is None:
        return []
    both_bundled = {ar.name, dlm.name} <= set(getattr(models, "bundled", ()))
    mismatch = None if both_bundled else helper_mismatch(models)
    out = [mismatch] if mismatch else []
    if getattr(bridge, "by", "ids") == "strings" and (mismatch or read_card(ar.ckpt.config).aligned_dlm is None):
        out.append(f"the AR helper '{ar.name}' has other token ids than the DLM '{dlm.name}', so CoDiLA pairs "
                   f"their tokens by string ({bridge.coverage:.0%} of the DLM's tokens have a partner) without "
                   "an alignment to this DLM: its blocks may be poor (align one with `codila train align`)")
    return out
