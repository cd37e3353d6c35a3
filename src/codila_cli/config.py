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
    bundled = false           # no "small demonstration models" line when the bundled models run

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

    path = path or config_path()
    if not path.exists():
        return UserConfig(path, False)
    try:
        raw = path.read_bytes().decode("utf-8")
        data = tomllib.loads(raw)
    except UnicodeDecodeError:
        raise UsageError(f"config file {path} is not UTF-8 text", hint="fix or delete it") from None
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        where = f" line {m.group(1)}" if m else ""
        raise UsageError(f"config file {path}{where}: {exc}", hint="fix the TOML syntax (https://toml.io)") from None
    except OSError as exc:
        raise UsageError(f"cannot read config file {path}: {exc.strerror or exc}",
                         hint="check its permissions, or point CODILA_CONFIG elsewhere") from None
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
