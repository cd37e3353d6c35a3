"""``codila infill``: fill code into a file; the model chooses how long the fill is (DreamOn)."""

from __future__ import annotations

import sys
from enum import Enum
from typing import Annotated, Any

import typer

from codila_cli.cli.options import (
    Color,
    ColorOption,
    Device,
    Dtype,
    Language,
    NoFitCheck,
    Quant,
    Quantize,
    QuantizeAr,
    Quiet,
    Threads,
    Verbose,
    ar_option,
    dlm_option,
    json_option,
    table_help,
    with_knob_flags,
)
from codila_cli.decoding.config import INFILL_KNOBS
from codila_cli.errors import StrictSyntaxError, UsageError
from codila_cli.ui.terminal import printable, say


class InfillDecoder(str, Enum):
    dreamon = "dreamon"
    codila = "codila"


@with_knob_flags(INFILL_KNOBS, help=table_help(INFILL_KNOBS), panel="Decoding", env=False)
def infill(
    *,
    file: Annotated[str, typer.Argument(help="File to fill (any language: the syntax report follows its extension, or --language), or `-` for stdin.")],
    line: Annotated[int | None, typer.Option("--line", "-l", help="Insert new code before line N (last+1 appends).", rich_help_panel="Input")] = None,
    lines: Annotated[str | None, typer.Option("--lines", help="Replace lines A-B (1-based, inclusive).", rich_help_panel="Input")] = None,
    instruction: Annotated[str | None, typer.Option("--instruction", "-i", help="What to write (given to the model as a comment above the prefix).", rich_help_panel="Input")] = None,
    language: Language = None,
    diff: Annotated[bool, typer.Option("--diff", help="Print a unified diff instead of the file.", rich_help_panel="Output")] = False,
    in_place: Annotated[bool, typer.Option("--in-place", help="Rewrite the file atomically (refused if it changed meanwhile).", rich_help_panel="Output")] = False,
    dlm: dlm_option("Infill DLM. [default: bundled-infill]", envvar="CODILA_INFILL_MODEL") = None,
    ar: ar_option("AR helper for --decoder codila.") = None,
    decoder: Annotated[InfillDecoder, typer.Option(help="dreamon, or codila (DreamOn marginals + AR blocks).", rich_help_panel="Decoding")] = InfillDecoder.dreamon,
    knobs: dict[str, Any],  # one flag per knob of INFILL_KNOBS (cli/options.py::with_knob_flags)
    seed: Annotated[int | None, typer.Option(help="Random seed (random when absent; always reported).", min=0, max=2**63 - 1, rich_help_panel="Decoding")] = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    threads: Threads = 0,
    no_fit_check: NoFitCheck = False,
    quantize: Quantize = Quant.none,
    quantize_ar: QuantizeAr = Quant.none,
    json_out: json_option("One JSON object (the middle, the new text, syntax, metrics).") = False,
    strict: Annotated[bool, typer.Option(help="Exit 4 (and do not write) when the fill introduces syntax errors or pyflakes finds something in it.", rich_help_panel="Output")] = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
    color: ColorOption = Color.auto,
) -> None:
    """Fill code into a file; the model chooses how long the fill is (DreamOn expand/delete).

    Where: --line N inserts before line N, --lines A-B replaces them, else a `# codila: fill` line
    (`// codila: fill`, `-- codila: fill` in other languages).
    The patched file goes to stdout unless --diff or --in-place.
    """
    from codila_cli.decoding.config import InfillConfig
    from codila_cli.engine import Engine
    from codila_cli.engine.generate import exact_note
    from codila_cli.engine.models import default_ar, default_infill_dlm
    from codila_cli.helper_card import helper_warnings
    from codila_cli.infill_files import disk_bytes, find_region, read_source, unified_diff, write_in_place
    from codila_cli.models.generation import task_sampling
    from codila_cli.report import clean, note_bundled
    from codila_cli.ui import terminal

    terminal.quiet_libraries(verbose)
    _check_outputs(file, in_place=in_place, json_out=json_out, diff=diff)
    src = read_source(file, language=language)
    if strict and src.language is None:
        raise UsageError(f"--strict needs a syntax check, and codila does not know {file}'s language",
                         hint="name it with --language (e.g. --language go), or drop --strict")
    region = find_region(src, line=line, lines_range=lines)
    codila = decoder == InfillDecoder.codila
    own_dlm, dlm = dlm is not None, dlm or default_infill_dlm()
    unread = [INFILL_KNOBS[n].option for n in InfillConfig.HELPER_ONLY if knobs[n] is not None and not codila]
    if unread:
        raise UsageError(f"{unread[0]} is a setting of --decoder codila", hint=f"add --decoder codila, or drop {unread[0]}")
    samp, sources = task_sampling(dlm, knobs)  # flag > generation_config > default
    cfg = InfillConfig.from_given({**knobs, **samp}, helper=codila)
    ar_name = (ar or (default_ar() if not own_dlm else None)) if codila else None
    if codila and not ar_name:
        raise UsageError("--decoder codila needs an AR helper", hint="pass --ar")
    engine = Engine.load(dlm=dlm, ar=ar_name, infill_dlm=dlm, device=device, dtype=dtype, threads=threads,
                         quantize=quantize.value, quantize_ar=quantize_ar.value)
    models = engine.models
    problem = cfg.room_problem(models.dlm.context_length)
    if problem:
        raise UsageError(problem, hint="lower --max-middle-tokens")
    note_bundled(models, quiet=quiet, command="infill")
    for w in helper_warnings(models) if codila and not quiet else ():
        say(f"Warning: {w}\n")
    if not quiet and (note := exact_note(models, decoder.value, cfg)):
        say(f"Warning: {note}\n")
    out = _run(engine, src, region, cfg, seed=seed, instruction=instruction, title=f"codila infill · {decoder.value}",
               live=terminal.stderr_is_tty() and not (json_out or quiet))
    name = file if file != "-" else "stdin"
    if strict and (out.introduced_errors or out.syntax_after.warnings):
        what = "introduces syntax errors" if out.introduced_errors else "has static findings (pyflakes)"
        raise StrictSyntaxError(f"the fill {what} (--strict); nothing was written",
                                hint="try another --seed or a different region")
    if in_place:
        write_in_place(src, disk_bytes(src, region, out.middle))
    if json_out:
        import json

        sys.stdout.write(json.dumps(_document(name, src, region, out, cfg, models, sources), ensure_ascii=False) + "\n")
    elif diff:
        sys.stdout.write(unified_diff(src, disk_bytes(src, region, out.middle), name.lstrip("/")))
    elif not in_place:
        sys.stdout.buffer.write(disk_bytes(src, region, out.middle))
    if not in_place:
        sys.stdout.flush()
    if not quiet:
        _print_status(_status(src, region, out, in_place=in_place, verbose=verbose), clean(out.syntax_after), color)


def _check_outputs(file: str, *, in_place: bool, json_out: bool, diff: bool) -> None:
    """Refuse output flags that do not go together, before anything loads."""
    if in_place and file == "-":
        raise UsageError("--in-place needs a file, not stdin", hint="give the file path, or drop --in-place")
    if in_place and json_out:
        raise UsageError("--in-place and --json do not go together", hint="use --json alone to inspect the fill")
    if diff and in_place:
        raise UsageError("--diff and --in-place do not go together", hint="use --diff to review, then --in-place to write")
    if diff and json_out:
        raise UsageError("--diff and --json do not go together", hint="--json already holds the fill and its span")


def _run(engine: Any, src: Any, region: Any, cfg: Any, *, seed: int | None, instruction: str | None, title: str,
         live: bool) -> Any:
    """The fill, followed by the live view (the middle between the lines around it) on a terminal."""
    if not live:
        return engine.infill(src, region, config=cfg, seed=seed, instruction=instruction)
    from codila_cli.infill_files import split
    from codila_cli.ui.live import InfillView
    from codila_cli.ui.terminal import stderr_console

    before, after = split(src, region)
    dlm = engine.models.dlm
    with InfillView(prefix=before, suffix=after, tokenizer=dlm.tokenizer, mask_id=dlm.specials.mask,
                    console=stderr_console(), title=title) as view:
        return engine.infill(src, region, config=cfg, seed=seed, instruction=instruction, on_step=view)


def _document(name: str, src: Any, region: Any, out: Any, cfg: Any, models: Any, sources: dict[str, str]) -> dict:
    """--json's object; ``text`` is the file exactly as it would be written: its BOM and line endings kept
    (issue 60: an editor writing it back rewrote every line ending), ``newline`` the file's line ending."""
    from codila_cli.decoding.knobs import flat
    from codila_cli.infill_files import disk_bytes

    return {"schema_version": 1, "command": "infill", "file": name,
            "region": {"how": region.how, "start_line": region.start + 1, "end_line": region.end},
            "middle": out.middle, "text": disk_bytes(src, region, out.middle).decode("utf-8"), "newline": src.newline,
            "seed": out.seed, "models": models.describe(),
            "settings": {**flat(cfg), "expand_budget": cfg.budget},
            "settings_sources": sources,
            "syntax": out.syntax_after.to_dict(), "syntax_before": out.syntax_before.to_dict(),
            "introduced_errors": out.introduced_errors, "context": out.context_cut, "metrics": out.metrics}


def _print_status(lines: list[str], ok: bool, color: Any) -> None:
    """The status lines on stderr, the syntax line green when the fill parses cleanly, else yellow."""
    from codila_cli.ui.terminal import stderr_console

    err = stderr_console(color.value)
    for line in lines:
        style = ("green" if ok else "yellow") if line.startswith("syntax:") else "yellow" if line.startswith("Warning") else None
        err.print(printable(line), style=style, markup=False, soft_wrap=True, highlight=False)


def _status(src: Any, region: Any, out: Any, *, in_place: bool, verbose: bool) -> list[str]:
    """stderr after a fill: where and how much, a context warning, the syntax report, and -v's numbers."""
    from codila_cli.report import exact_line, syntax_line

    where = f"lines {region.start + 1}-{region.end}" if region.end > region.start else f"before line {region.start + 1}"
    lines = [f"filled {where} with {out.middle.count(chr(10))} line(s)" + (f"; wrote {src.path}" if in_place else "")]
    cut = out.context_cut
    if cut["prefix_kept"] < cut["prefix_tokens"] or cut["suffix_kept"] < cut["suffix_tokens"]:
        lines.append(f"Warning: the file is longer than the model's context; the model saw the {cut['prefix_kept']} "
                     f"prefix and {cut['suffix_kept']} suffix tokens nearest the fill (the output keeps the whole file)")
    status = syntax_line(out.syntax_after)
    if src.guessed and src.language is not None:  # stdin names no language: say where it came from
        status += f" (checked as {src.language.name}: guessed from {src.guessed}; --language names it)"
    if out.introduced_errors:
        status += " (introduced by the fill)"
    elif out.syntax_before.checked and not out.syntax_before.valid:
        status += " (the file had syntax errors before the fill)"
    lines.append(status)
    if verbose:
        m = out.metrics
        lines.append(f"seed: {out.seed}  dlm forwards: {m['dlm_forwards']}  ar forwards: {m['ar_forwards']}  "
                     f"middle tokens: {m['middle_tokens']}  expansions: {m['expansions']}  deletions: "
                     f"{m['deletions']}  tokens/step: {m['tokens_per_step']:.2f}  decode: {m['wall_seconds']:.2f}s")
        if m.get("freedave"):
            lines.append(exact_line(m))
    return lines
