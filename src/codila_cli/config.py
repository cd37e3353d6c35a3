"""User configuration: ``config.toml`` in the platformdirs config directory, or ``$CODILA_CONFIG``.

Precedence for every setting: command-line flag > ``CODILA_*`` environment variable > config file >
built-in default. Example file::

    [models]
    dlm = "dream-coder"       # alias, repo id or directory
    ar = "qwen3-0.6b"

    [runtime]
    device = "cuda"
    dtype = "bfloat16"

    [notices]
    bundled = false           # no "demo models" note when the bundled models run (or CODILA_NOTICE=0)

    [gen]
    decoder = "codila"
    block_size = 4
    tau = 0.5
    max_new_tokens = 256

A malformed file is an error naming the file and line (exit 2); unknown keys are warned about and
ignored; a value of the wrong type is an error.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codila_cli.decoding.config import GEN_KNOBS
from codila_cli.errors import UsageError

# section -> key -> allowed TOML value types: [gen] and [runtime] from the knob table (decoding/config.py)
SCHEMA: dict[str, dict[str, tuple[type, ...]]] = {
    "models": {"dlm": (str,), "ar": (str,)},
    "notices": {"bundled": (bool,)},  # false: no "demonstration models" line when the bundled models run
    **GEN_KNOBS.schema(),
}


def config_path() -> Path:
    if os.environ.get("CODILA_CONFIG"):
        return Path(os.path.expanduser(os.environ["CODILA_CONFIG"]))
    from platformdirs import user_config_dir

    return Path(user_config_dir("codila")) / "config.toml"


@dataclass(frozen=True)
class UserConfig:
    path: Path
    exists: bool
    values: dict[str, dict[str, Any]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def get(self, section: str, key: str) -> Any:
        return self.values.get(section, {}).get(key)


def load_config(path: Path | None = None) -> UserConfig:
    import tomllib

    from codila_cli.user_input import read_text

    path = path or config_path()
    try:
        os.stat(path)
    except FileNotFoundError:
        if not os.path.lexists(path):  # absent (not a broken link, not behind a closed directory): defaults
            return UserConfig(path, False)
    except OSError:
        pass  # a loop, a directory that cannot be entered: read_text names it
    raw = read_text(path, what="config file", kind="config", bom=True)  # a BOM (Windows editors) is no error
    try:
        data = tomllib.loads(raw)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        where = f" line {m.group(1)}" if m else ""
        raise UsageError(f"config file {path}{where}: {exc}", hint="fix the TOML syntax (https://toml.io)") from None
    values: dict[str, dict[str, Any]] = {}
    warnings: list[str] = []
    for section, table in data.items():
        if section not in SCHEMA or not isinstance(table, dict):
            warnings.append(f"unknown config section [{section}] in {path} (ignored)")
            continue
        for key, value in table.items():
            if key not in SCHEMA[section]:
                warnings.append(f"unknown config key {section}.{key} in {path} (ignored)")
                continue
            types = SCHEMA[section][key]
            if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
                want = " or ".join(t.__name__ for t in types)
                raise UsageError(f"config file {path}: {section}.{key} must be {want}, got {value!r}",
                                 hint="fix the value or remove the key")
            if list in types and not all(isinstance(v, str) for v in value):
                raise UsageError(f"config file {path}: {section}.{key} must be a list of strings, got {value!r}",
                                 hint="fix the value or remove the key")
            values.setdefault(section, {})[key] = (tuple(value) if list in types else
                                                   float(value) if float in types and not isinstance(value, str) else value)
    return UserConfig(path, True, values, tuple(warnings))


def env_name(key: str) -> str:
    return "CODILA_" + key.upper()


def set_value(key: str, text: str | None, *, path: Path | None = None) -> tuple[Path, Any]:
    """``codila config set KEY VALUE`` (``text`` None: ``config unset KEY``): the value parsed by the key's
    type (true / false, a number, a comma list for ``stop``), checked against its knob's range, and
    written into config.toml atomically with the rest of the file kept as it was (tomlkit). Returns the
    file and the value written (None when unset)."""
    import tomlkit
    import tomllib

    from codila_cli.atomic import write_text_atomic

    section, _, name = key.partition(".")
    if section not in SCHEMA or name not in SCHEMA[section]:
        keys = ", ".join(f"{s}.{k}" for s, table in SCHEMA.items() for k in table)
        raise UsageError(f"unknown config key {key!r}", hint=f"the keys: {keys} (docs/settings.md)")
    value = None if text is None else _parse(key, section, name, text)
    path = path or config_path()
    from codila_cli.user_input import read_bytes

    # through the safe reader: a regular file of bounded size only (not a FIFO, not /dev/zero)
    raw = read_bytes(path, what="config file", kind="config") if os.path.lexists(path) else None
    try:
        doc = tomlkit.parse(raw.decode("utf-8-sig") if raw is not None else "")
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, tomlkit.exceptions.ParseError) as exc:
        raise UsageError(f"cannot update config file {path}: {exc}", hint="fix or delete the file first") from None
    if value is None:
        if section in doc and name in doc[section]:
            del doc[section][name]
    else:
        if section not in doc:
            doc[section] = tomlkit.table()
        doc[section][name] = list(value) if isinstance(value, tuple) else value
    path.parent.mkdir(parents=True, exist_ok=True)
    # over a regular file only, keeping its owner, mode and links; an edit made meanwhile is kept (atomic.py)
    write_text_atomic(path, tomlkit.dumps(doc), expect=raw)
    return path, value


def _parse(key: str, section: str, name: str, text: str) -> Any:
    types = SCHEMA[section][name]
    try:
        if bool in types:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                raise ValueError
            value: Any = text.lower() in ("true", "1", "yes", "on")
        elif list in types:
            value = tuple(p for p in text.split(",") if p)
        elif int in types and float not in types:
            value = int(text)
        elif float in types:
            value = float(text)
        else:
            value = text
    except ValueError:
        want = " or ".join(t.__name__ for t in types)
        raise UsageError(f"{key} must be {want}, got {text!r}", hint="see docs/settings.md for each key's values") from None
    knob = GEN_KNOBS.get(name) if section in ("gen", "runtime") else None
    if knob is not None and not knob.in_range(value):
        raise UsageError(f"{key} must be {knob.range_text() or knob.kind.__name__}, got {text!r}",
                         hint="see docs/settings.md for each key's values")
    return value
