"""The ``codila`` Typer app: the root callback, the one error boundary every command runs inside, and
``main`` (the console script).

Commands live one per module next to this one and never handle errors themselves: :func:`guarded`
wraps each in :func:`boundary`, which turns every failure into one ``Error:`` line, a ``Hint:`` and a
documented exit code (docs/exit-codes.md). stdout carries only the payload; torch and transformers are
imported inside the commands, so ``codila --help`` stays fast.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Annotated, Any, NoReturn, TypeVar

import typer

from codila_cli import __version__
from codila_cli.cli.eval import eval_cmd
from codila_cli.cli.gen import gen
from codila_cli.cli.infill import infill
from codila_cli.cli.models import config_path, config_set, config_show, config_unset, doctor, models
from codila_cli.cli.options import PanelCommand
from codila_cli.cli.plan import plan
from codila_cli.cli.pull import pull
from codila_cli.cli.serve import serve
from codila_cli.cli.train import STAGES, align
from codila_cli.errors import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, EXIT_RUNTIME, CodilaError, UsageError
from codila_cli.ui.terminal import say

T = TypeVar("T")

app = typer.Typer(
    name="codila",
    help="Code generation with diffusion language models and CoDiLA local autoregression.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_show_locals=False,
    add_completion=True,  # --install-completion / --show-completion: Typer's own (bash, zsh, fish, PowerShell)
    rich_markup_mode=None,  # plain help and parse errors: `codila --help` in about 0.15 s instead of 0.3 s
)


def _fail(exc: CodilaError, *, quiet: bool = False) -> NoReturn:
    from codila_cli.ui.terminal import printable

    err = sys.stderr
    err.write(f"Error: {printable(exc.message, keep=chr(10))}\n")  # a user's path or id never reaches the terminal raw
    if exc.hint and not quiet:
        err.write(f"Hint: {printable(exc.hint, keep=chr(10))}\n")
    err.flush()
    raise typer.Exit(exc.exit_code)


def boundary(fn: Callable[[], T], *, command: str, quiet: bool = False) -> T:
    """Run ``codila <command>``'s body; map every failure to an ``Error:`` line and a documented exit code."""
    debug = os.environ.get("CODILA_DEBUG") == "1"
    try:
        return fn()
    except typer.Exit:
        raise
    except CodilaError as exc:
        if debug:
            raise
        _fail(exc, quiet=quiet)
    except ValueError as exc:  # configuration dataclasses validate with ValueError
        if debug:
            raise
        _fail(UsageError(str(exc), hint=f"see `codila {command} --help` for the allowed values"), quiet=quiet)
    except KeyboardInterrupt:
        say("Interrupted.\n")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BrokenPipeError:  # the reader went away (`codila gen … | head`): stop quietly, as Unix tools do
        _silence_stdout()
        raise typer.Exit(EXIT_BROKEN_PIPE) from None
    except MemoryError:
        _fail(CodilaError("out of memory", hint="lower --max-new-tokens or use a smaller model"), quiet=quiet)
    except OSError as exc:  # the machine, not codila: a full disk, a permission, a vanished directory
        if debug:
            raise
        where = f": {exc.filename}" if exc.filename else ""
        _fail(CodilaError(f"{exc.strerror or exc}{where}",
                          hint="check free disk space and permissions, then run the command again"), quiet=quiet)
    except Exception as exc:
        if debug:
            raise
        name = type(exc).__name__
        if "OutOfMemoryError" in name:
            _fail(CodilaError(f"the GPU ran out of memory ({exc})",
                              hint="lower --max-new-tokens, use --dtype bfloat16, or --device cpu"), quiet=quiet)
        say(f"Error: internal error: {name}: {exc}\n")
        if not quiet:
            say("Hint: set CODILA_DEBUG=1 for the full traceback, and report it\n")
        raise typer.Exit(EXIT_RUNTIME) from None


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null, so the interpreter's last flush on exit cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass


def guarded(fn: Callable[..., Any], command: str) -> Callable[..., Any]:
    """``fn`` run inside :func:`boundary` (its ``quiet`` option, if any, drops the Hint line); Typer
    reads the options from ``fn``'s own signature through ``functools.wraps``."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        def body() -> Any:
            if kwargs.get("quiet") and kwargs.get("verbose"):
                raise UsageError("-q/--quiet and -v/--verbose do not go together", hint="drop one of them")
            if sys.stdout is None and not kwargs.get("in_place"):  # `codila gen … >&-`: before any work
                raise UsageError("stdout is closed, so the result has nowhere to go",
                                 hint="redirect it (> out.py, or > /dev/null)")
            return fn(*args, **kwargs)

        return boundary(body, command=command, quiet=bool(kwargs.get("quiet", False)))

    return run


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"codila {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", "-V", callback=_version, is_eager=True, help="Print the version.")] = False,
) -> None:
    """codila: diffusion code generation. Results go to stdout; status and errors to stderr."""


config_app = typer.Typer(help="Show where the configuration lives and what it resolves to.", no_args_is_help=True,
                         rich_markup_mode=None)
app.command("gen", cls=PanelCommand)(guarded(gen, "gen"))
app.add_typer(config_app, name="config")
config_app.command("path")(guarded(config_path, "config path"))
config_app.command("show")(guarded(config_show, "config show"))
config_app.command("set")(guarded(config_set, "config set"))
config_app.command("unset")(guarded(config_unset, "config unset"))
app.command("models")(guarded(models, "models"))
app.command("pull")(guarded(pull, "pull"))
app.command("doctor")(guarded(doctor, "doctor"))
app.command("eval", cls=PanelCommand)(guarded(eval_cmd, "eval"))
app.command("infill", cls=PanelCommand)(guarded(infill, "infill"))
app.command("plan", cls=PanelCommand)(guarded(plan, "plan"))
app.command("serve")(guarded(serve, "serve"))
train_app = typer.Typer(help="Align a CoDiLA helper to any DLM (align), or build the bundled models stage by stage.",
                        no_args_is_help=True, rich_markup_mode=None)
app.add_typer(train_app, name="train")
train_app.command("align")(guarded(align, "train align"))
for _name, _command in STAGES.items():
    train_app.command(_name)(guarded(_command, f"train {_name}"))


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _parser_error(exc: Exception) -> int | None:
    """The parser's own errors (unknown option, a value of the wrong type, a missing argument) carry an
    exit code and a message: one Error line and a Hint, like codila's own usage errors. None: not one."""
    message, exit_code = getattr(exc, "format_message", None), getattr(exc, "exit_code", None)
    if not callable(message) or not isinstance(exit_code, int):
        return None
    ctx = getattr(exc, "ctx", None)
    text = message()
    if ctx is not None and text == ctx.get_help():  # a bare group (`codila`, `codila config`): its help
        say(text + "\n")
    else:
        where = ctx.command_path if ctx is not None else "codila"
        say(f"Error: {text}\nHint: see `{where} --help`\n")
    return exit_code


def _utf8_mode() -> None:
    """Run in Python's UTF-8 mode whatever the locale: a C or POSIX locale (``LC_ALL=C``, cron, minimal
    containers) would decode the arguments as ASCII and write stdout as ASCII, so a prompt with ``é``
    reached the tokenizer as lone surrogates (issue 50). The process re-executes itself with ``-X utf8``
    (bytes of arguments and paths pass through unchanged). An argument that is still not UTF-8 text
    and names no file is refused here, with exit 2."""
    if sys.flags.utf8_mode:
        os.environ.pop("CODILA_NO_REEXEC", None)  # set by the re-execution below; children start afresh
    elif (sys.getfilesystemencoding().lower().replace("-", "") != "utf8"
          and os.environ.get("CODILA_NO_REEXEC") != "1"):  # a guard against a loop, should -X utf8 not take
        os.environ["CODILA_NO_REEXEC"] = "1"
        try:
            os.execv(sys.executable, [sys.executable, "-X", "utf8", "-m", "codila_cli", *sys.argv[1:]])
        except OSError:
            pass  # carry on in this locale; the check below still holds
    for arg in sys.argv[1:]:
        if any("\udc80" <= ch <= "\udcff" for ch in arg) and not os.path.lexists(arg):
            shown = arg.encode("utf-8", "surrogateescape")[:60]
            say(f"Error: an argument is not valid UTF-8 text: {shown!r}\n"
                "Hint: codila reads text as UTF-8; convert it first (e.g. iconv -f latin1 -t utf-8)\n")
            sys.exit(UsageError.exit_code)


def main() -> None:
    import signal

    _utf8_mode()
    signal.signal(signal.SIGTERM, _on_sigterm)  # SIGTERM ends a run like Ctrl-C: exit 130, nothing partial
    try:
        code = app(standalone_mode=False, prog_name="codila")
    except KeyboardInterrupt:
        say("Interrupted.\n")
        _exit_now(EXIT_INTERRUPTED)
    except CodilaError as exc:  # an option's own check while the arguments are parsed (--language)
        try:
            _fail(exc)
        except typer.Exit as done:
            sys.exit(done.exit_code)
    except Exception as exc:
        exit_code = _parser_error(exc)
        if exit_code is None:
            raise
        sys.exit(exit_code)
    try:
        sys.stdout.flush()
    except (BrokenPipeError, AttributeError, ValueError):  # a reader that left, or a closed stdout
        _silence_stdout()
        if code in (None, 0) and sys.stdout is not None:
            code = EXIT_BROKEN_PIPE
    if code == EXIT_INTERRUPTED:
        _exit_now(code)
    sys.exit(code if isinstance(code, int) else 0)


def _exit_now(code: int) -> None:
    """End an interrupted run at once. Every ``finally`` (temporary files, partial rows) has run by the
    time the interrupt reached here; what remains is the interpreter's own teardown of torch and its
    thread pools, which took about a second on a loaded machine (issue 40). Streams are flushed first."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass
    os._exit(code)
