"""Option types every command shares, defined once: ``--dlm``, ``--ar``, ``--device``, ``--dtype``,
``--json``, ``-q``, ``-v``, ``--color``. Each is an ``Annotated`` alias (a factory where the help text
names what the command does with it)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

import typer
import typer.core


class Color(str, Enum):
    auto = "auto"
    always = "always"
    never = "never"


def dlm_option(help: str, *, envvar: str = "CODILA_MODEL") -> Any:
    """``--dlm``/``-m``: alias, repo id or directory; each command has its own variable and default."""
    return Annotated[str | None, typer.Option("--dlm", "-m", envvar=envvar, help=help, rich_help_panel="Model")]


def ar_option(help: str) -> Any:
    """``--ar``: the AR helper for CoDiLA (``CODILA_AR_MODEL``)."""
    return Annotated[str | None, typer.Option("--ar", envvar="CODILA_AR_MODEL", help=help, rich_help_panel="Model")]


def json_option(help: str = "One JSON object.") -> Any:
    return Annotated[bool, typer.Option("--json", help=help, rich_help_panel="Output")]


Device = Annotated[str, typer.Option(envvar="CODILA_DEVICE", help="auto, cpu, cuda, cuda:N, mps.", rich_help_panel="Runtime")]
Dtype = Annotated[str, typer.Option(envvar="CODILA_DTYPE", help="auto, float32, bfloat16, float16 (auto: see codila gen --help).", rich_help_panel="Runtime")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Only the payload and errors.", rich_help_panel="Output")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Seed, settings and timings on stderr.", rich_help_panel="Output")]
ColorOption = Annotated[Color, typer.Option(help="Colour on stderr.", rich_help_panel="Output")]


def knob_option(name: str, *short: str) -> Any:
    """A ``codila gen`` option from the knob table: its flag (a bool's with its ``--no-`` form), the short
    flags given, its ``CODILA_*`` variable, its help with ``[default: …]`` and its --help panel."""
    from codila_cli.decoding.config import GEN_KNOBS

    k = GEN_KNOBS[name]
    flag = f"{k.option}/--no-{k.option[2:]}" if k.kind is bool else k.option
    return typer.Option(flag, *short, envvar=k.env_var, show_default=False, help=knob_help(name),
                        rich_help_panel=k.panel)


def panel(name: str) -> str:
    """A --help panel by name (decoding/knobs.py::PANELS), checked."""
    from codila_cli.decoding.knobs import PANELS

    if name not in PANELS:
        raise ValueError(f"no help panel {name!r}")
    return name


class PanelCommand(typer.core.TyperCommand):
    """Plain (not Rich) --help with the options in panels, in PANELS order: Typer draws panels only with
    Rich markup, which this app leaves off so that ``codila --help`` stays fast."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        from codila_cli.decoding.knobs import PANELS

        groups: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                name = "Arguments" if param.param_type_name == "argument" else (
                    getattr(param, "rich_help_panel", None) or "Options")
                groups.setdefault(name, []).append(record)
        # a command's own options without a panel come first, unless only --help is left there
        own_first = len(groups.get("Options", [])) > 1
        order = [g for g in PANELS if g != "Options"]
        order = ["Arguments", *(["Options"] if own_first else []), *order, *([] if own_first else ["Options"])]
        for name in sorted(groups, key=lambda g: order.index(g) if g in order else len(order)):
            with formatter.section(name):
                formatter.write_dl(groups[name])


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
