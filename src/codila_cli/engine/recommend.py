"""The settings a helper checkpoint recommends (``codila_decoding`` in its config.json): which keys
count, their types and ranges, and the values that apply for a block size."""

from __future__ import annotations

from codila_cli.models.registry import resolve_spec

RECOMMENDABLE: dict[str, type] = {"block_size": int, "candidate_blocks": int, "ar_context": int,
                                  "ar_repetition_penalty": float, "cache": str, "cache_blocks": int,
                                  "ar_syntax_guard": bool, "ar_no_repeat_ngram": int, "conditioning": str}


def recommendable(key: str, value: object) -> bool:
    """A setting a helper checkpoint may recommend, with a value of its type (an int counts as a float;
    ``cache`` is one of decoding.config.CACHES, ``conditioning`` "soft" or "topk:K") and in range (no
    negative number)."""
    import re

    from codila_cli.decoding.config import CACHES

    kind = RECOMMENDABLE.get(key)
    if key == "conditioning":
        return isinstance(value, str) and bool(re.fullmatch(r"soft|topk:[1-9][0-9]*", value))
    if kind is str:
        return value in CACHES
    if kind is bool:
        return type(value) is bool
    ok = type(value) is int if kind is int else kind is float and type(value) in (int, float)
    return ok and value >= 0


def recommendable_per_block_size(value: object) -> bool:
    """A ``by_block_size`` table a helper may recommend: {"8": {KEY: value, …}, …}, block sizes as positive
    integers, each table of recommendable settings other than ``block_size``."""
    return isinstance(value, dict) and bool(value) and all(
        str(b).isdigit() and int(b) > 0 and isinstance(one, dict) and "block_size" not in one
        and all(recommendable(k, v) for k, v in one.items()) for b, one in value.items())


def recommended_decoding(ar: str, *, block_size: int | None = None) -> dict[str, int | float | str]:
    """CoDiLA settings an AR helper checkpoint recommends: ``codila_decoding`` in its config.json (the way
    a generation_config.json carries a model's sampling defaults); {} when it has none. Only the keys in
    RECOMMENDABLE with values of their type count (an int is accepted for a float); flags, environment
    variables and the user's config file override them. ``cache`` (none / prefix / dual) is recommended
    where it was measured to keep quality on that pair (the bundled one: docs/results.md §2, session 11);
    ``cache_blocks`` applies only when a cache is on.

    ``by_block_size`` {"8": {...}} holds settings chosen for one block size: they replace the general
    ones when the block size is ``block_size`` (the user's), or else the recommended or default one."""
    import json

    from codila_cli.errors import CodilaError
    from codila_cli.models.cache import resolve_local_dir

    try:
        cfg = json.loads((resolve_local_dir(resolve_spec(ar, kind="ar")) / "config.json").read_text(encoding="utf-8"))
    except (CodilaError, OSError, ValueError):  # loading reports a missing or broken checkpoint itself
        return {}
    rec = cfg.get("codila_decoding") if isinstance(cfg, dict) else None
    if not isinstance(rec, dict):
        return {}
    out = {k: RECOMMENDABLE[k](v) for k, v in rec.items() if recommendable(k, v)}
    if block_size is None:  # the library default, as `codila gen` uses it (resolve.GEN_DEFAULTS)
        from codila_cli.decoding.config import CodilaConfig

        block_size = out.get("block_size", CodilaConfig.__dataclass_fields__["block_size"].default)
    per = rec.get("by_block_size")
    one = per.get(str(block_size)) if isinstance(per, dict) else None
    if isinstance(one, dict):
        out.update({k: RECOMMENDABLE[k](v) for k, v in one.items() if k != "block_size" and recommendable(k, v)})
    return out
