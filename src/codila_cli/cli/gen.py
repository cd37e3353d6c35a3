"""``codila gen``: a prompt in, code on stdout (or one JSON document), the syntax report on stderr."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from codila_cli.cli.options import (
    Color,
    ColorOption,
    HelpAll,
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
    knob_help,
    panel,
    with_knob_flags,
)
from codila_cli.decoding.config import GEN_KNOBS
from codila_cli.errors import StrictSyntaxError, UsageError
from codila_cli.ui.terminal import printable, say


@with_knob_flags(GEN_KNOBS, help=knob_help)
def gen(
    *,
    ctx: typer.Context,
    prompt: Annotated[str | None, typer.Argument(help="The prompt; `-` (or none, with stdin piped) reads stdin. Text piped beside a prompt is context before it (stdin, a blank line, the prompt); stdout repeats only the prompt.")] = None,
    prompt_file: Annotated[Path | None, typer.Option("--prompt-file", "-f", help="Read the prompt from a file.", rich_help_panel=panel("Input"))] = None,
    system: Annotated[str | None, typer.Option("--system", "-s", help="System message (chat models).", rich_help_panel=panel("Input"))] = None,
    language: Language = None,
    with_stdin: Annotated[bool, typer.Option("--stdin", help="Wait for stdin however long it takes and put it before the prompt (without it, a pipe silent for 1 s is left unread, with a warning), e.g. `slow-tool | codila gen --stdin \"implement this\"`.", rich_help_panel=panel("Input"))] = False,
    dlm: dlm_option("Diffusion model: alias, repo id or directory. [default: bundled-dlm]") = None,
    ar: ar_option("AR helper for CoDiLA: alias, repo id or directory. [default: bundled-ar with the bundled DLM]") = None,
    knobs: dict[str, Any],  # one flag per knob of GEN_KNOBS (cli/options.py::with_knob_flags)
    compile_model: Annotated[bool, typer.Option("--compile", help="torch.compile the model forwards (pays on GPUs; slow first call).", rich_help_panel=panel("Runtime"))] = False,
    threads: Threads = 0,
    no_fit_check: NoFitCheck = False,
    quantize: Quantize = Quant.none,
    quantize_ar: QuantizeAr = Quant.none,
    seed: Annotated[int | None, typer.Option(help="Random seed (random when absent; always reported).", rich_help_panel=panel("Decoding"), min=0, max=2**63 - 1)] = None,
    num_samples: Annotated[int, typer.Option("--num-samples", "-n", help="Decode N samples (seeds seed, seed+1, …): in one batch on a GPU, one after another on a CPU, where that is faster; 1–64.", rich_help_panel=panel("Decoding"))] = 1,
    json_out: json_option("Print one JSON object instead of the code.") = False,
    completion_only: Annotated[bool, typer.Option("--completion-only", help="stdout gets only what the model wrote, not the prompt before it (a raw completion otherwise repeats the prompt).", rich_help_panel=panel("Output"))] = False,
    stream: Annotated[bool, typer.Option("--stream/--no-stream", help="Write final text as it is decoded (raw completion, no live view).", rich_help_panel=panel("Output"))] = True,
    strict: Annotated[bool, typer.Option(help="Exit 4 when the result does not parse, looks wrong (a function that only returns its argument, or has no body), when pyflakes finds something in the generated code (an undefined name, an unused import, …), or when --check fails.", rich_help_panel=panel("Output"))] = False,
    check: Annotated[bool, typer.Option("--check", help="Run the prompt's doctests (>>> examples) against the result in the eval jail (needs bubblewrap); the report says whether they pass. Without it, nothing checks what the code does.", rich_help_panel=panel("Output"))] = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
    color: ColorOption = Color.auto,
    help_all: HelpAll = False,
) -> None:
    """Generate code from a prompt with a diffusion LM (plain, threshold, or CoDiLA decoding).

    Settings come from flags, then CODILA_* environment variables, then config.toml, then defaults.

    Examples:

        codila gen "def fib(n):"

        codila gen --decoder codila --block-size 4 --tau 0.5 "def is_prime(n):"

        codila gen -n 4 --temperature 0.5 "def parse(line):"

        cat spec.md | codila gen --json > out.json

        echo "Return the sum." | codila gen "def total(xs):" > total.py
    """
    from codila_cli.checks import run_doctests
    from codila_cli.config import load_config
    from codila_cli.engine import Engine
    from codila_cli.engine.generate import exact_note
    from codila_cli.engine.prompts import is_chat
    from codila_cli.helper_card import helper_warnings
    from codila_cli.prompts import read_prompt_parts, silent_stdin_warning
    from codila_cli.report import clean, note_bundled
    from codila_cli.ui import terminal

    terminal.quiet_libraries(verbose)
    user = load_config()
    if not quiet:
        for w in user.warnings:
            say(f"Warning: {w}\n")
    if not 1 <= num_samples <= 64:
        raise UsageError(f"--num-samples must be between 1 and 64, got {num_samples}",
                         hint="ask for fewer samples, or run codila several times")
    given = read_prompt_parts(prompt, prompt_file, with_stdin=with_stdin)
    text = given.text
    if given.silent_stdin and not quiet:
        say(silent_stdin_warning(wait_flag=True, sent=given.stdin_sent))
    if not text.strip():
        raise UsageError("the prompt is empty", hint='give a prompt: codila gen "def fib(n):"')
    req = _resolve(ctx, knobs, user=user, dlm=dlm, ar=ar, language=language)
    engine = Engine.load(dlm=req.dlm, ar=req.ar, device=req.device, dtype=req.dtype, compile=compile_model, threads=threads,
                         settings=req, quantize=quantize.value, quantize_ar=quantize_ar.value)
    models = engine.models
    note_bundled(models, quiet=quiet, user=user)
    err = terminal.stderr_console(color.value)
    live = terminal.stderr_is_tty() and not (json_out or quiet)
    for w in helper_warnings(models) if req.decoder == "codila" and not quiet else ():
        say(f"Warning: {w}\n")
    if not quiet and (note := exact_note(models, req.decoder, req.config)):
        say(f"Warning: {note}\n")
    if system and not quiet and not is_chat(models.dlm.tokenizer):
        say(f"Warning: {req.dlm} has no chat template, so --system is not a system message: "
                         "the model reads it as plain text before the prompt (stdout does not repeat it)\n")
    if num_samples > 1:
        _many(models, text, req, seed=seed, system=system, n=num_samples, live=live, json_out=json_out,
              strict=strict, quiet=quiet, verbose=verbose, err=err, echo=not completion_only, context=given.context)
        return
    result = _one(engine, text, req, seed=seed, system=system, live=live, stream=stream, json_out=json_out, err=err,
                  echo=not completion_only, context=given.context)
    checked = run_doctests(result.text, text[given.context:]) if check else None  # in the jail (checks.py)
    if json_out:
        import json

        doc = {**result.to_json(models=models.describe()), "settings_sources": req.sources,
               **({"prompt_context": text[: given.context]} if given.context else {}),
               **({"check": checked.to_dict()} if checked is not None else {})}
        sys.stdout.write(json.dumps(doc, ensure_ascii=False) + "\n")
    sys.stdout.flush()
    _report(result, req, models, quiet=quiet, verbose=verbose, err=err, prompt=text[given.context:], checked=checked,
            named=language is not None)
    if strict and not (clean(result.syntax) and (checked is None or checked.passed)):
        what = ("does not parse" if not result.syntax.valid else
                f"has {len(result.syntax.warnings)} finding(s)" if not clean(result.syntax) else "fails --check")
        raise StrictSyntaxError(f"the generated code {what} (--strict)",
                                hint="try another --seed, a smaller --block-size or --tokens-per-step")


def _resolve(ctx: typer.Context, knobs: dict[str, Any], *, user: Any, dlm: str | None, ar: str | None,
             language: str | None = None) -> Any:
    """The request the flags make (resolve.resolve_gen), told which values a ``CODILA_*`` variable gave
    (Typer knows); a flag only another decoder reads is an error (resolve.unread_flag), as is the
    syntax guard (Python's rules) for another --language."""
    from dataclasses import replace

    from codila_cli.languages import names, resolve
    from codila_cli.resolve import resolve_gen, unread_flag

    from_env = frozenset(n for n in knobs if getattr(ctx.get_parameter_source(n), "name", "") == "ENVIRONMENT")
    req = resolve_gen(knobs, user=user, dlm=dlm, ar=ar, from_env=from_env)
    unread = unread_flag(req)
    if unread:
        raise unread
    try:
        lang = resolve(language=language)
    except ValueError as exc:
        raise UsageError(str(exc).split(" (known")[0], hint=f"--language takes one of: {', '.join(names())}") from None
    if lang is not None and not lang.python and getattr(req.config, "ar_syntax_guard", False):
        raise UsageError(f"--ar-syntax-guard holds the helper to Python's rules, and --language is {lang.name}",
                         hint="drop --ar-syntax-guard (or set ar_syntax_guard = false in config.toml)")
    return replace(req, language=lang)


def _shown(result: Any, prompt: str, echo: bool) -> str:
    """What stdout gets of a result: the text (a raw completion repeats the prompt), or with
    ``--completion-only`` (echo False) the text without the prompt. A chat answer never repeats it."""
    return result.text if echo or result.mode == "chat" else result.text[len(prompt):]


def _without_context(result: Any, prompt: str, context: int, language: Any = None) -> Any:
    """A raw completion without the ``context`` characters piped before the prompt (prompts.py): they were
    the model's to read, not part of the program, so stdout, --json's text and the syntax report leave
    them out (the report of a program with an English spec on top would always say "does not parse").
    With ``language`` (--language), the report checks the text as that language."""
    if (not context or result.mode == "chat") and language is None:
        return result
    from dataclasses import replace

    from codila_cli.syntax import check_code

    text = result.text[context:] if result.mode != "chat" else result.text
    span = (len(prompt) - context, len(text)) if result.mode != "chat" else None
    return replace(result, text=text, syntax=check_code(text, language=language or _checked_as(result), span=span))


def _checked_as(result: Any) -> Any:
    from codila_cli.languages import PYTHON, by_name

    return by_name(result.syntax.language or "") or PYTHON


def _one(engine: Any, text: str, req: Any, *, seed: int | None, system: str | None, live: bool, stream: bool,
         json_out: bool, err: Any, echo: bool = True, context: int = 0) -> Any:
    """One decode: streamed to stdout (a pipe, base models), followed by a live view (a terminal), or
    plain. Writes the text on stdout unless the caller prints JSON."""
    from codila_cli.engine.prompts import is_chat

    models, generate = engine.models, engine.generate
    run = {"decoder": req.decoder, "config": req.config, "seed": seed, "system": system}
    if stream and not json_out and not live and not is_chat(models.dlm.tokenizer):
        from codila_cli.ui.stream import StdoutStreamer

        streamer = StdoutStreamer(tokenizer=models.dlm.tokenizer, specials=models.dlm.specials, prompt=text,
                                  out=sys.stdout, stop=req.config.stop, echo=echo, context=context)
        result = _without_context(generate(text, **run, on_step=streamer), text, context, req.language)
        streamer.finish(_shown(result, text[context:], echo))
        return result
    if live:
        from codila_cli.ui.live import LiveView, view_block

        with LiveView(tokenizer=models.dlm.tokenizer, mask_id=models.dlm.specials.mask, console=err,
                      block_width=view_block(req.config), title=f"codila gen · {req.decoder}",
                      prompt=text[context:]) as view:
            result = generate(text, **run, on_step=view)
    else:
        result = generate(text, **run)
    result = _without_context(result, text, context, req.language)
    if not json_out:
        sys.stdout.write(_shown(result, text[context:], echo))
    return result


def _report(result: Any, req: Any, models: Any, *, quiet: bool, verbose: bool, err: Any, prompt: str = "",
            checked: Any = None, named: bool = False) -> None:
    """The syntax report, then what ``--check`` found. Green only for what was checked and held: code
    that merely parses is reported in the terminal's own colour, with what would check it."""
    from codila_cli.report import check_line, clean, gen_verbose_lines, syntax_line, unchecked_note, unfinished_note

    if quiet:
        return
    line = syntax_line(result.syntax, named=named)
    if clean(result.syntax) and checked is None:
        line += unchecked_note(prompt)
    err.print(printable(line), style=None if clean(result.syntax) else "yellow", markup=False, highlight=False,
              soft_wrap=True)
    if checked is not None:
        text, ok = check_line(checked)
        err.print(printable(text), style="green" if ok else "red", markup=False, highlight=False, soft_wrap=True)
    if result.syntax.checked and not result.syntax.valid and not result.metrics["ended"]:
        err.print(unfinished_note(req.config.max_new_tokens), style="yellow", markup=False, soft_wrap=True)
    if verbose:
        for line in gen_verbose_lines(result, req.decoder, req.config, models, req.sources):
            err.print(printable(line), markup=False, soft_wrap=True)


def _many(models: Any, text: str, req: Any, *, seed: int | None, system: str | None, n: int, live: bool,
          json_out: bool, strict: bool, quiet: bool, verbose: bool, err: Any, echo: bool = True,
          context: int = 0) -> None:
    """``gen --num-samples N``: samples on stdout in order, each after a comment line (or one JSON document)."""
    import json

    from codila_cli.report import clean, samples_summary_line, samples_verbose_lines
    from codila_cli.samples import all_greedy, sample_many, sample_seeds, samples_document

    if not quiet and all_greedy(req.config):
        say("Warning: with these settings every sample is the same (nothing is sampled); set "
                         "--temperature" + (" and --ar-temperature above 0" if req.decoder == "codila" else " above 0")
                         + " to get different samples\n")
    seeds = sample_seeds(seed, n)
    view = None
    if live:
        from codila_cli.ui.live import LiveView, view_block

        def view(i: int) -> LiveView:
            return LiveView(tokenizer=models.dlm.tokenizer, mask_id=models.dlm.specials.mask, console=err,
                            block_width=view_block(req.config), prompt=text[context:],
                            title=f"codila gen · {req.decoder} · sample {i + 1} of {n}")

    from codila_cli.ui.progress import item_progress

    shown: dict[int, Any] = {}  # each sample without the piped context, made once

    def one_done(i: int, r: Any) -> None:
        shown[i] = _without_context(r, text, context, req.language)
        done(f"sample (seed {r.seed}): {'parses' if shown[i].syntax.valid else 'does not parse'}")

    with item_progress("gen", n, quiet=quiet or live, tty=False) as done:  # a live view shows its own progress
        out = sample_many(models, text, decoder=req.decoder, config=req.config, seeds=seeds, system=system, view=view,
                          on_done=one_done)
    out.results[:] = [shown.get(i) or _without_context(r, text, context, req.language) for i, r in enumerate(out.results)]
    if json_out:
        sys.stdout.write(json.dumps({**samples_document(out, models), "settings_sources": req.sources},
                                    ensure_ascii=False) + "\n")
    else:
        for i, r in enumerate(out.results):
            sys.stdout.write(f"# codila sample {i + 1}/{n} (seed {r.seed})\n{_shown(r, text[context:], echo)}")
    sys.stdout.flush()
    line, all_valid = samples_summary_line(out, n, req.config.max_new_tokens)
    if not quiet:
        err.print(printable(line), style="green" if all_valid else "yellow", markup=False, soft_wrap=True)
    if verbose and not quiet:
        for text_line in samples_verbose_lines(out, seeds, req.decoder, req.config, models):
            err.print(printable(text_line), markup=False, soft_wrap=True)
    bad = sum(not clean(r.syntax) for r in out.results)
    if strict and bad:
        raise StrictSyntaxError(f"{bad} of {n} samples do not parse or have static findings (--strict)",
                                hint="try other seeds, a smaller --block-size or --tokens-per-step")
