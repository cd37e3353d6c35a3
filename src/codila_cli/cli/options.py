"""Option types every command shares, defined once: ``--dlm``, ``--ar``, ``--device``, ``--dtype``,
``--json``, ``-q``, ``-v``, ``--color``. Each is an ``Annotated`` alias (a factory where the help text
names what the command does with it). The decoding flags are made from the knob table
(:func:`with_knob_flags`), so no command spells a knob."""

from __future__ import annotations

import functools
import textwrap
from collections.abc import Callable
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
def _no_fit_check(value: bool) -> bool:
    """--no-fit-check reaches the loader as CODILA_NO_FIT_CHECK (models/fit.py), whatever command loads."""
    if value:
        import os

        os.environ["CODILA_NO_FIT_CHECK"] = "1"
    return value


NoFitCheck = Annotated[bool, typer.Option("--no-fit-check", callback=_no_fit_check, help="Load even when the fit check says the models need more memory than this device has (CODILA_MEMORY_LIMIT sets the limit it checks against).", rich_help_panel="Runtime")]
class Quant(str, Enum):
    none = "none"
    int8 = "int8"
    int4 = "int4"
    auto = "auto"


Quantize = Annotated[Quant, typer.Option("--quantize", envvar="CODILA_QUANTIZE", help="The diffusion model's weights in 8 or 4 bits (weight-only; products in bf16 under --dtype auto). SDAR-1.7B's shape held 0.52× (int8) and 0.35× (int4) of bf16's memory; on a CPU faster over few rows, slower over long canvases (docs/quantization.md). auto: of bf16, int8 and int4, the fastest on this CPU for this model (a cached probe) among those that fit the memory.", rich_help_panel="Runtime")]
QuantizeAr = Annotated[Quant, typer.Option("--quantize-ar", envvar="CODILA_QUANTIZE_AR", help="The AR helper's weights in 8 or 4 bits, or auto (as --quantize).", rich_help_panel="Runtime")]
Threads = Annotated[int, typer.Option("--threads", envvar="CODILA_THREADS", min=0, max=1024, help="CPU threads torch runs; 0 = auto: the usable cores less those other processes keep busy, less one (so a busy core never stalls the run; docs/usage.md).", rich_help_panel="Runtime")]
def _known_language(ctx: typer.Context, value: str | None) -> str | None:
    """--language (or CODILA_LANGUAGE), refused under the name the user set it by when codila does not know it."""
    if value:
        from codila_cli.languages import by_name, names

        if by_name(value) is None:
            from codila_cli.errors import UsageError

            source = getattr(ctx.get_parameter_source("language"), "name", "")
            where = "CODILA_LANGUAGE" if source == "ENVIRONMENT" else "--language"
            raise UsageError(f"{where}: unknown language {value!r}", hint=f"{where} takes one of: {', '.join(names())}")
    return value


Language = Annotated[str | None, typer.Option("--language", envvar="CODILA_LANGUAGE", callback=_known_language, help="What the syntax report checks the code as: python, javascript, typescript, tsx, go, rust, java, c, cpp, csharp, bash, ruby, … (`codila models --languages` lists them; aliases and editors' ids such as js, typescriptreact work). Default: the file's extension or #! line (gen: Python, or a chat answer's fence).", rich_help_panel="Input")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Only the payload and errors.", rich_help_panel="Output")]
Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Seed, settings and timings on stderr.", rich_help_panel="Output")]
ColorOption = Annotated[Color, typer.Option(help="Colour on stderr.", rich_help_panel="Output")]


def knob_option(name: str) -> Any:
    """A ``codila gen`` knob's option type from the table (decoding/config.py::GEN_KNOBS), for a command
    that takes a few of them by hand (``serve``'s --device, --dtype)."""
    from codila_cli.decoding.config import GEN_KNOBS

    k = GEN_KNOBS[name]
    return Annotated[knob_type(k), _knob_flag(k, help=knob_help(name), panel=k.panel, env=True)]


def with_knob_flags(table: Any, *, help: Callable[[str], str], panel: str | None = None, env: bool = True) -> Any:
    """Decorator: the command's ``knobs`` parameter becomes one option per knob of ``table`` that has a
    flag, in the table's order: the long flag (a bool's with its ``--no-`` form) and ``Knob.letter``, the
    ``CODILA_*`` variable (when ``env``), ``help(name)``, the knob's --help panel (or ``panel``). The
    command is called with them as ``knobs``: {name: value, None where not given}, a choice as its string
    and a repeated flag as a tuple. So a knob is declared once, in the table, and every command's flags
    follow it."""
    import inspect

    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(command, eval_str=True)
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values()]
        at = [p.name for p in params].index("knobs")
        flagged = [k for k in table.values() if k.option]
        flags = [inspect.Parameter(k.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[
            knob_type(k), _knob_flag(k, help=help(k.name), panel=panel or k.panel, env=env)]) for k in flagged]

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            knobs = {k.name: knob_value(kwargs.pop(k.name, None)) for k in flagged}
            return command(knobs=knobs, **kwargs)

        run.__signature__ = sig.replace(parameters=[*params[:at], *flags, *params[at + 1 :]])  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in run.__signature__.parameters.values()}  # type: ignore[attr-defined]
        return run

    return wrap


def knob_type(k: Any) -> Any:
    """What Typer parses a knob's flag into (None: not given): an Enum of its choices (so --help lists
    them and Typer refuses others), a list of strings for a tuple knob, else its kind."""
    base = _choices(k.name, k.choices) if k.choices else list[str] if k.kind is tuple else k.kind
    return base | None


@functools.cache
def _choices(name: str, choices: tuple[str, ...]) -> type[Enum]:
    return Enum(name.title().replace("_", ""), [(c, c) for c in choices], type=str)  # type: ignore[return-value]


def _knob_flag(k: Any, *, help: str, panel: str, env: bool) -> Any:
    long = f"{k.option}/--no-{k.option[2:]}" if k.kind is bool else k.option
    return typer.Option(long, *([k.letter] if k.letter else []), envvar=k.env_var if env else None,
                        show_default=False, help=help, rich_help_panel=panel)


def knob_value(value: Any) -> Any:
    """A flag's value as the table holds it: a choice as its string, a repeated flag as a tuple (None if empty)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, list):
        return tuple(value) or None
    return value


def panel(name: str) -> str:
    """A --help panel by name (decoding/knobs.py::PANELS), checked."""
    from codila_cli.decoding.knobs import PANELS

    if name not in PANELS:
        raise ValueError(f"no help panel {name!r}")
    return name


FOLDED = ("Decoder internals",)  # panels that --help lists by flag only, and --help-all in full


def _help_all(ctx: typer.Context, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        ctx.meta["codila.help_all"] = True
        typer.echo(ctx.get_help())
        raise typer.Exit()


HelpAll = Annotated[bool, typer.Option("--help-all", is_eager=True, expose_value=False, callback=_help_all,
                                       help="Show this message with every panel in full, and exit.")]


class PanelCommand(typer.core.TyperCommand):
    """Plain (not Rich) --help with the options in panels, in PANELS order: Typer draws panels only with
    Rich markup, which this app leaves off so that ``codila --help`` stays fast. A command with
    ``--help-all`` (:data:`HelpAll`) lists the FOLDED panels by flag only under --help."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        from codila_cli.decoding.knobs import PANELS

        groups: dict[str, list[tuple[str, str]]] = {}
        flags: dict[str, list[str]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                name = "Arguments" if param.param_type_name == "argument" else (
                    getattr(param, "rich_help_panel", None) or "Options")
                groups.setdefault(name, []).append(record)
                flags.setdefault(name, []).append(max(param.opts, key=len))
        fold = any(p.name == "help_all" for p in self.params) and not ctx.meta.get("codila.help_all")
        # a command's own options without a panel come first, unless only --help (and --help-all) is there
        own_first = any(not r[0].startswith(("-h, --help", "--help")) for r in groups.get("Options", []))
        order = [g for g in PANELS if g != "Options"]
        order = ["Arguments", *(["Options"] if own_first else []), *order, *([] if own_first else ["Options"])]
        for name in sorted(groups, key=lambda g: order.index(g) if g in order else len(order)):
            with formatter.section(name):
                if fold and name in FOLDED:  # flags whole: no line break inside one
                    text = f"{', '.join(flags[name])}. What each does: --help-all."
                    for line in textwrap.wrap(text, formatter.width - formatter.current_indent, break_on_hyphens=False):
                        formatter.write(" " * formatter.current_indent + line + "\n")
                else:
                    formatter.write_dl(groups[name])


def knob_help(name: str, *, extra: str = "") -> str:
    """A ``codila gen`` flag's help from the knob table (decoding/config.py::GEN_KNOBS): the decoders that
    read it (when not all), the knob's help, ``extra``, and ``[default: …]``."""
    from codila_cli.decoding.config import GEN_KNOBS
    from codila_cli.decoding.knobs import knob_fields
    from codila_cli.resolve import decoder_configs

    k = GEN_KNOBS[name]
    configs = decoder_configs()
    users = [d for d, cls in configs.items() if name in knob_fields(cls)]
    prefix = f"{'/'.join(users)}: " if 0 < len(users) < len(configs) else ""
    return f"{prefix}{k.help}{extra} [default: {k.default_words()}]"


def table_help(table: Any) -> Callable[[str], str]:
    """A flag's help from a knob table without helper recommendations (``infill``, ``plan``): the knob's
    help and ``[default: …]``."""
    return lambda name: f"{table[name].help} [default: {table[name].default_words(helper=False)}]"
