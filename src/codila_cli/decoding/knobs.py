"""The machinery of the knob table: one :class:`Knob` per decoding setting, declared once in
decoding/config.py (``GEN_KNOBS``, ``INFILL_KNOBS``), and everything derived from it: the config
dataclasses' defaults, the config-file schema (config.py), the keys a helper may recommend
(helper_card.py), the eval setting keys and labels (eval/settings.py), the ``-v`` / ``--json`` settings
report (report.py), the flags of `gen` and `infill` (cli/options.py::with_knob_flags) and docs/settings.md
(scripts/gen_settings_docs.py). No knob is named here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any

PANELS = ("Input", "Model", "Decoding", "CoDiLA helper", "Decoder internals", "Sandbox", "Output", "Runtime", "Options")
"""`codila gen --help`'s panels, in the order they print: the common settings first, the long tail of
decoder internals after them."""


@dataclass(frozen=True)
class Knob:
    """One setting. ``kind``: int, float, str, bool or tuple (of str); ``optional``: None is a value
    (unset: the decoder derives it, e.g. ``steps``); ``lo``/``hi`` the closed range (``open_lo``/
    ``open_hi`` make an end open) and ``off`` a value outside it that turns the knob off; ``choices``
    for a str. ``short``: the key in eval setting strings (``codila:B=4``); ``recommend``: a helper's
    ``codila_decoding`` may set it; ``show``: ``-v`` prints it always (else only when it is not the
    default); ``flag``: the command-line flag ("" = none), ``letter`` a one-letter flag beside it (``-B``);
    ``env``: it has a ``CODILA_*`` variable;
    ``default_text``: the help's ``[default: …]`` where the value is derived; ``section``: config.toml's
    table; ``follows``: unset, the knob takes the value of the named knob (the helper's temperature is
    ``--temperature`` unless told otherwise), unless that value is a model's own default; ``inert_when``:
    (knob, value) under which this knob means nothing or cannot run (a cache window without a cache, a
    cache under verification), so a helper's recommendation of it is dropped there; ``grid``: the
    decoder works in blocks of this many slots (the live view draws them). ``model``: a DLM's
    ``generation_config.json`` may set it, under the same name (models/generation.py)."""

    name: str
    kind: type
    default: Any
    help: str
    optional: bool = False
    lo: float | None = None
    hi: float | None = None
    open_lo: bool = False
    open_hi: bool = False
    off: Any = None
    choices: tuple[str, ...] = ()
    pattern: tuple[str, str] | None = None  # (regular expression a str must match, how the help writes it)
    short: str | None = None
    recommend: bool = False
    show: bool = False
    flag: str | None = None
    letter: str | None = None
    env: bool = True
    default_text: str | None = None
    section: str = "gen"
    panel: str = "Decoder internals"  # the --help panel of its flag (PANELS)
    follows: str | None = None
    inert_when: tuple[str, Any] | None = None
    grid: bool = False
    model: bool = False

    @property
    def option(self) -> str:
        """The long flag, ``--block-size`` for ``block_size`` unless the table names another."""
        return self.flag if self.flag is not None else "--" + self.name.replace("_", "-")

    @property
    def env_var(self) -> str | None:
        return "CODILA_" + self.name.upper() if self.env else None

    def file_types(self) -> tuple[type, ...]:
        """The TOML value types config.toml accepts (an int for a float; a list of strings for a tuple)."""
        return {float: (float, int), tuple: (list,)}.get(self.kind, (self.kind,))

    def range_text(self) -> str:
        """The allowed values in words: "1–256", "(0, 1]", "0 (off) or 2–64", "soft | topk:K"."""
        if self.choices:
            return " | ".join(self.choices)
        if self.pattern:
            return self.pattern[1]
        if self.lo is None and self.hi is None:
            return ""
        lo = "" if self.lo is None else f"{self.lo:g}"
        hi = "∞" if self.hi is None else f"{self.hi:g}"
        text = f"{'(' if self.open_lo else '['}{lo}, {hi}{')' if self.open_hi or self.hi is None else ']'}"
        if self.kind is int and not self.open_lo and not self.open_hi and self.hi is not None:
            text = f"{lo}–{hi}"
        return f"{self.off!r} (off) or {text}" if self.off is not None else text

    def default_words(self, *, helper: bool = True) -> str:
        """What the help's ``[default: …]`` says: the value, or how it is derived; a recommendable knob
        names the helper's recommendation first (``gen``)."""
        base = self.default_text or ("none" if self.default is None else _words(self.default))
        return f"the helper's recommendation, else {base}" if self.recommend and helper else base

    def in_range(self, value: Any) -> bool:
        """Whether ``value`` is of the knob's kind and within its range, choices or ``off``."""
        if value is None:
            return self.optional
        if self.kind is bool:
            return type(value) is bool
        if self.kind is int and (type(value) is not int):
            return False
        if self.kind is float and (type(value) not in (int, float) or not math.isfinite(value)):
            return False
        if self.kind is str:
            import re

            return isinstance(value, str) and (not self.choices or value in self.choices) and (
                not self.pattern or re.fullmatch(self.pattern[0], value) is not None)
        if self.kind is tuple:
            return isinstance(value, tuple) and all(isinstance(v, str) for v in value)
        if self.off is not None and value == self.off:
            return True
        lo_ok = self.lo is None or (value > self.lo if self.open_lo else value >= self.lo)
        hi_ok = self.hi is None or (value < self.hi if self.open_hi else value <= self.hi)
        return lo_ok and hi_ok

    def parse(self, text: str, *, key: str | None = None, where: str = "") -> Any:
        """A value from text (an eval setting string, ``--decoding KEY=VALUE``, a ``CODILA_*`` variable);
        the ValueError names ``key`` (default: the eval key, else the name), the kind and ``where``."""
        key = key or self.short or self.name
        if self.kind is bool:
            if text not in ("0", "1", "true", "false"):
                raise ValueError(f"{key} must be 0 or 1{where}, got {text!r}")
            return text in ("1", "true")
        if self.kind in (int, float):
            try:
                return self.kind(text)
            except ValueError:
                what = "an integer" if self.kind is int else "a number"
                raise ValueError(f"{key} must be {what}{where}, got {text!r}") from None
        return text


def _words(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ", ".join(value) or "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


class KnobTable(Mapping[str, Knob]):
    """The knobs of one command, in the order the docs and eval keys list them."""

    def __init__(self, *knobs: Knob, panels: Mapping[str, tuple[str, ...]] | None = None) -> None:
        """``panels``: the --help panel of named knobs (the rest keep their own, by default "Decoder internals")."""
        from dataclasses import replace

        where = {name: panel for panel, names in (panels or {}).items() for name in names}
        unknown = set(where) - {k.name for k in knobs}
        if unknown or set(panels or {}) - set(PANELS):
            raise ValueError(f"panels name unknown knobs or panels: {sorted(unknown)}")
        self._knobs = {k.name: replace(k, panel=where[k.name]) if k.name in where else k for k in knobs}
        if len(self._knobs) != len(knobs):
            raise ValueError("a knob is declared twice")
        shorts = [k.short for k in knobs if k.short]
        if len(set(shorts)) != len(shorts):
            raise ValueError("two knobs share an eval key")

    def __getitem__(self, name: str) -> Knob:
        return self._knobs[name]

    def __iter__(self):
        return iter(self._knobs)

    def __len__(self) -> int:
        return len(self._knobs)

    def default(self, name: str) -> Any:
        """A dataclass field's default, read from the table (``block_size: int = GEN_KNOBS.default(…)``)."""
        return self._knobs[name].default

    def defaults(self) -> dict[str, Any]:
        return {k.name: k.default for k in self._knobs.values()}

    def recommendable(self) -> dict[str, Knob]:
        return {k.name: k for k in self._knobs.values() if k.recommend}

    def schema(self) -> dict[str, dict[str, tuple[type, ...]]]:
        """config.toml's sections and keys with the TOML types each accepts."""
        out: dict[str, dict[str, tuple[type, ...]]] = {}
        for k in self._knobs.values():
            out.setdefault(k.section, {})[k.name] = k.file_types()
        return out


def knob_fields(cls: type) -> list[str]:
    """The knob names a config dataclass reads: its own fields, a nested config's (``sampling``) flattened."""
    names: list[str] = []
    for f in fields(cls):
        names += knob_fields(f.default_factory) if _nested(f) else [f.name]
    return names


def _nested(f: Any) -> bool:
    return f.default_factory is not MISSING and is_dataclass(f.default_factory)


def build(cls: type, value: Any, **fixed: Any) -> Any:
    """A config dataclass with each knob field read as ``value(name)`` (nested configs likewise), except
    the ones in ``fixed``; the dataclass validates the result (ValueError)."""
    kw: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in fixed:
            kw[f.name] = fixed[f.name]
        elif _nested(f):
            kw[f.name] = build(f.default_factory, value)
        else:
            kw[f.name] = value(f.name)
    return cls(**kw)


def from_given(table: KnobTable, cls: type, given: Mapping[str, Any], **fixed: Any) -> Any:
    """``cls`` built from the values ``given`` by knob name (None or absent: ``table``'s default), the
    fields in ``fixed`` aside: a command's flags made into its config."""
    values = {**table.defaults(), **{k: v for k, v in given.items() if v is not None}}
    return build(cls, values.__getitem__, **fixed)


def flat(config: Any) -> dict[str, Any]:
    """A config dataclass's knob values by name, nested configs flattened (``temperature`` from ``sampling``)."""
    out: dict[str, Any] = {}
    for f in fields(config):
        v = getattr(config, f.name)
        if is_dataclass(v) and not isinstance(v, type):
            out.update(flat(v))
        else:
            out[f.name] = v
    return out


def label_parts(table: KnobTable, values: Mapping[str, Any]) -> list[str]:
    """``KEY=value`` for each knob with an eval key in ``values``, in table order: the ones marked ``show``
    always, the others only when they differ from the default."""
    parts = []
    for k in table.values():
        if not k.short or k.name not in values:
            continue
        v = values[k.name]
        if k.show or v != k.default:
            parts.append(f"{k.short}={_short_value(v)}")
    return parts


def _short_value(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return f"{v:g}" if isinstance(v, float) else str(v)


def followers(table: KnobTable, name: str) -> list[str]:
    """The knobs of ``table`` that follow ``name`` when they are not set themselves."""
    return [k.name for k in table.values() if k.follows == name]


def inert(table: KnobTable, values: Mapping[str, Any]) -> list[str]:
    """The knobs of ``table`` that mean nothing or cannot run under ``values`` (their ``inert_when``
    holds; a knob absent from ``values`` has its default)."""
    return [k.name for k in table.values() if k.inert_when is not None
            and values.get(k.inert_when[0], table.default(k.inert_when[0])) == k.inert_when[1]]


def block_width(table: KnobTable, cfg: Any) -> int | None:
    """The block width ``cfg``'s decoder works in (its ``grid`` knob), or None (no blocks: dream)."""
    names = set(knob_fields(type(cfg))) if is_dataclass(cfg) else set()
    return next((getattr(cfg, k.name) for k in table.values() if k.grid and k.name in names), None)


def check_positive(name: str, value: int | None, *, limit: int) -> None:
    """A count knob's value in 1 … ``limit`` (None passes), else a ValueError naming its flag ``name``."""
    if value is not None and not (1 <= value <= limit):
        raise ValueError(f"{name} must be between 1 and {limit}, got {value}")


def check_stop(stop: tuple[str, ...]) -> None:
    """``--stop`` values: a tuple of non-empty one-line prefixes, else a ValueError."""
    if not isinstance(stop, tuple):
        raise ValueError(f"stop must be a tuple of line prefixes, got {type(stop).__name__}")  # noqa: TRY004 -- config errors are ValueErrors
    for prefix in stop:
        if not prefix or "\n" in prefix or "\r" in prefix:
            raise ValueError(f"stop: each prefix is the non-empty start of one line, got {prefix!r}")


def exact_problem(config: Any) -> str | None:
    """Why ``config`` (any generation or infill config) cannot decode exactly in fewer forwards, or None: FreeDave
    (decoding/freedave.py) verifies deterministic steps, so a decode that draws at random is refused."""
    deterministic = not config.draws() and not getattr(config, "cfg_scale", 0)  # LLaDA's guidance: not in its rule
    return None if deterministic else ("--exact verifies deterministic steps: it runs at --temperature 0 with a "
                                       "confidence rule (not --alg origin, --alg-temp or --remasking random) and no --cfg-scale")
