"""``codila plan``: a multi-unit program the SDDC way, contract first, then all units together."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from codila_cli.cli.options import (
    Color,
    ColorOption,
    Device,
    Dtype,
    NoFitCheck,
    Quant,
    Quantize,
    Quiet,
    Threads,
    Verbose,
    dlm_option,
    json_option,
    table_help,
    with_knob_flags,
)
from codila_cli.decoding.plan_config import PLAN_KNOBS
from codila_cli.errors import StrictSyntaxError, UsageError
from codila_cli.ui.terminal import say


@with_knob_flags(PLAN_KNOBS, help=table_help(PLAN_KNOBS), env=False)
def plan(
    *,
    prompt: Annotated[str | None, typer.Argument(help="What the program should do; `-` reads stdin.")] = None,
    prompt_file: Annotated[Path | None, typer.Option("--prompt-file", "-f", help="Read the prompt from a file.", rich_help_panel="Input")] = None,
    contract_file: Annotated[Path | None, typer.Option("--contract", help="Use this contract instead of writing one.", rich_help_panel="Input")] = None,
    show_contract: Annotated[bool, typer.Option("--show-contract", help="Print the contract on stderr.", rich_help_panel="Output")] = False,
    defines: Annotated[str | None, typer.Option("--defines", help="Comma-separated names, one unit each, in order: the model writes the rest of the contract.", rich_help_panel="Input")] = None,
    knobs: dict[str, Any],  # one flag per knob of PLAN_KNOBS (cli/options.py::with_knob_flags)
    commit: Annotated[str, typer.Option(help="'single' (one token per canvas per iteration) or a threshold γ_u in (0, 1].", rich_help_panel="Decoding")] = "single",
    dlm: dlm_option("[default: bundled-plan, else bundled-dlm]", envvar="CODILA_PLAN_MODEL") = None,
    seed: Annotated[int | None, typer.Option(help="Random seed (random when absent; always reported).", min=0, max=2**63 - 1, rich_help_panel="Decoding")] = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    threads: Threads = 0,
    no_fit_check: NoFitCheck = False,
    quantize: Quantize = Quant.none,
    json_out: json_option("One JSON object with the contract, units and metrics.") = False,
    strict: Annotated[bool, typer.Option(help="Exit 4 when the program does not parse or pyflakes finds something in it.", rich_help_panel="Output")] = False,
    quiet: Quiet = False,
    verbose: Verbose = False,
    color: ColorOption = Color.auto,
) -> None:
    """Write a multi-unit program the SDDC way: contract first, then all units denoised together."""
    from codila_cli.contract import parse_commit, parse_defines, prompt_defines, read_contract
    from codila_cli.decoding.knobs import flat, from_given
    from codila_cli.decoding.plan_config import PlanConfig
    from codila_cli.engine import Engine
    from codila_cli.models.generation import task_sampling
    from codila_cli.models.registry import default_plan_dlm
    from codila_cli.prompts import read_prompt_parts, silent_stdin_warning
    from codila_cli.report import clean, note_bundled
    from codila_cli.ui import terminal

    terminal.quiet_libraries(verbose)
    given = read_prompt_parts(prompt, prompt_file)
    text = given.text
    if given.silent_stdin and not quiet:
        say(silent_stdin_warning(wait_flag=False, sent=given.stdin_sent))
    if not text.strip():  # before any model loads
        raise UsageError("the prompt is empty", hint='codila plan "a CLI that counts words in files"')
    gamma = parse_commit(commit)
    names = parse_defines(defines or (None if contract_file is not None else prompt_defines(text)))
    if contract_file is not None and defines:
        raise UsageError("--defines and --contract both set the units", hint="name the units in the contract file")
    dlm = dlm or default_plan_dlm()
    samp, _ = task_sampling(dlm, knobs)  # flag > generation_config.json > default
    cfg = from_given(PLAN_KNOBS, PlanConfig, {**knobs, **samp}, commit=gamma, defines=names,
                     budget_menu=PlanConfig.budget_menu)
    user_contract = read_contract(contract_file) if contract_file is not None else None
    engine = Engine.load(dlm=dlm, ar=None, device=device, dtype=dtype, threads=threads, quantize=quantize.value)
    models = engine.models
    note_bundled(models, quiet=quiet, command="plan")
    out = _run(engine, text, cfg, user_contract, seed=seed, live=terminal.stderr_is_tty() and not (json_out or quiet))
    if not quiet:
        for w in out["warnings"]:
            say(f"Warning: {w}\n")
    if show_contract and not quiet:
        say(out["contract"])
    if json_out:
        import json

        doc = {"schema_version": 1, "command": "plan", **{k: v for k, v in out.items() if k != "syntax"},
               "syntax": out["syntax"].to_dict(), "models": models.describe(),
               "settings": flat(cfg)}
        sys.stdout.write(json.dumps(doc, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(out["text"])
    sys.stdout.flush()
    if not quiet:
        _status(out, verbose=verbose, color=color.value)
    if strict and not clean(out["syntax"]):
        what = "does not parse" if not out["syntax"].valid else "has static findings (pyflakes)"
        raise StrictSyntaxError(f"the assembled program {what} (--strict)",
                                hint="the program was still written to stdout; try another --seed")


def _run(engine: Any, text: str, cfg: Any, contract: Any, *, seed: int | None, live: bool) -> dict:
    """The plan, followed on a terminal by the live view (one row per unit canvas under the contract)."""
    if not live:
        return engine.plan(text, config=cfg, contract=contract, seed=seed)
    from codila_cli.ui.live import PlanView
    from codila_cli.ui.terminal import stderr_console

    dlm = engine.models.dlm
    with PlanView(tokenizer=dlm.tokenizer, mask_id=dlm.specials.mask, console=stderr_console(),
                  title="codila plan") as view:
        return engine.plan(text, config=cfg, contract=contract, seed=seed, on_step=view)


def _status(out: dict, *, verbose: bool, color: str = "auto") -> None:
    from codila_cli.report import clean, syntax_line
    from codila_cli.ui.terminal import stderr_console

    stderr_console(color).print(syntax_line(out["syntax"]), style="green" if clean(out["syntax"]) else "yellow",
                                markup=False, soft_wrap=True, highlight=False)
    if verbose:
        m = out["metrics"]
        say(f"seed: {out['seed']}  iterations: {m['iterations']} (contract {m['contract_iterations']})  "
                         f"misbound: {m['misbound']:.0%}  overrun: {m['overrun']:.0%}  all defined: {m['all_defined']}  "
                         f"latency: {m['latency_seconds']:.2f}s\n")
