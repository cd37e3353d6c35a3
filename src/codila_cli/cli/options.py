"""Option types every command shares, defined once: ``--dlm``, ``--ar``, ``--device``, ``--dtype``,
``--json``, ``-q``, ``-v``, ``--color``. Each is an ``Annotated`` alias (a factory where the help text
names what the command does with it)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

import typer

DTYPE_HELP = ("auto (bf16 on CUDA; on a CPU fp32, but bf16 for checkpoints stored in bf16 that are 2 GiB or more, "
              "or diffusion models on a CPU with AMX), float32, bfloat16, float16.")


class Color(str, Enum):
    auto = "auto"
    always = "always"
    never = "never"


def dlm_option(help: str, *, envvar: str = "CODILA_MODEL") -> Any:
    """``--dlm``/``-m``: alias, repo id or directory; each command has its own variable and default."""
    return Annotated[str | None, typer.Option("--dlm", "-m", envvar=envvar, help=help)]


def ar_option(help: str) -> Any:
    """``--ar``: the AR helper for CoDiLA (``CODILA_AR_MODEL``)."""
    return Annotated[str | None, typer.Option("--ar", envvar="CODILA_AR_MODEL", help=help)]


def json_option(help: str = "One JSON object.") -> Any:
    return Annotated[bool, typer.Option("--json", help=help)]


Device = Annotated[str, typer.Option(envvar="CODILA_DEVICE", help="auto, cpu, cuda, cuda:N, mps.")]
Dtype = Annotated[str, typer.Option(envvar="CODILA_DTYPE", help="auto, float32, bfloat16, float16 (auto: see codila gen --help).")]
# gen reads config.toml's [runtime] too, so its flags default to None (= not given)
LayeredDevice = Annotated[str | None, typer.Option(envvar="CODILA_DEVICE", help="auto, cpu, cuda, cuda:N, mps. [default: auto]")]
LayeredDtype = Annotated[str | None, typer.Option(envvar="CODILA_DTYPE", help=DTYPE_HELP + " [default: auto]")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Only the payload and errors.")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Seed, settings and timings on stderr.")]
ColorOption = Annotated[Color, typer.Option(help="Colour on stderr.")]


def knob_help(name: str, *, extra: str = "") -> str:
    """A ``codila gen`` flag's help from the knob table (decoding/config.py::GEN_KNOBS): the decoders that
    read it (when not all), the knob's help, ``extra``, and ``[default: …]``."""
    from codila_cli.decoding.config import GEN_KNOBS, CodilaConfig, DreamConfig, ThresholdConfig
    from codila_cli.decoding.knobs import knob_fields

    k = GEN_KNOBS[name]
    users = [d for d, cls in (("dream", DreamConfig), ("threshold", ThresholdConfig), ("codila", CodilaConfig))
             if name in knob_fields(cls)]
    prefix = f"{'/'.join(users)}: " if 0 < len(users) < 3 else ""
    return f"{prefix}{k.help}{extra} [default: {k.default_words()}]"


def infill_help(name: str) -> str:
    """A ``codila infill`` flag's help from the knob table (INFILL_KNOBS), with ``[default: …]``."""
    from codila_cli.decoding.config import INFILL_KNOBS

    k = INFILL_KNOBS[name]
    return f"{k.help} [default: {k.default_words(helper=False)}]"
