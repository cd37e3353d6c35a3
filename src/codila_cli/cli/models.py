"""``codila models``, ``codila doctor`` and ``codila config path|show``: what is installed, whether it
runs here, and what the configuration resolves to (the data comes from codila_cli.info)."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from codila_cli.cli.options import json_option
from codila_cli.errors import EXIT_RUNTIME
from codila_cli.ui.terminal import say


def models(
    json_out: json_option() = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the names of available models.")] = False,
    languages: Annotated[bool, typer.Option("--languages", help="List the languages the syntax report checks instead (name, extensions, aliases, checks).")] = False,
    fit: Annotated[bool, typer.Option("--fit", help="For each model in the cache, whether it fits this machine's memory now (the fit check every load runs) at its auto dtype, and if not, which of --dtype bfloat16, --quantize int8, --quantize int4 makes it fit.")] = False,
) -> None:
    """List model aliases, whether each is in the Hugging Face cache, the bundled models, and the model
    families codila runs with what each supports (gen's decoders, infill, plan, CoDiLA, KV cache)."""
    from codila_cli.info import list_families, list_languages, list_models

    if fit:
        return _fit(json_out)
    if languages:
        rows = list_languages()
        if json_out:
            sys.stdout.write(json.dumps({"schema_version": 1, "command": "models --languages", "languages": rows}) + "\n")
            return
        sys.stdout.write("".join(f"{r['name']}\n" for r in rows) if quiet else "".join(
            f"{r['name']:<11} {' '.join(r['extensions']) or '-':<34} {r['checks']}\n" for r in rows))
        return
    rows = list_models()
    if json_out:
        sys.stdout.write(json.dumps({"schema_version": 1, "command": "models", "models": rows,
                                     "families": list_families()}) + "\n")
    elif quiet:
        sys.stdout.write("".join(f"{r['alias']}\n" for r in rows if r["cached"]))
    else:
        w, fw = max(15, *(len(r["alias"]) for r in rows)), max(6, *(len(r["family"]) for r in rows))
        sys.stdout.write(f"{'alias':<{w}} {'kind':<7} {'available':<10} {'size':>10}  {'revision':<17} {'family':<{fw}} "
                         f"{'licence':<11} {'default for':<16} repository\n")
        for r in rows:
            size = _size(r["size_bytes"]) if r["size_bytes"] else "-"
            default = ", ".join(r["default_for"]) or "-"
            rev = {"pinned": "pinned ", "recorded by codila pull": "pulled "}.get(r["revision_source"], "") + (
                r["revision"][:8] if r["revision"] else "-" if r["revision_source"] == "bundled" else "at pull")
            sys.stdout.write(f"{r['alias']:<{w}} {r['kind']:<7} {'yes' if r['cached'] else 'no':<10} {size:>10}  "
                             f"{rev:<17} {r['family']:<{fw}} {r['licence']:<11} {default:<16} {r['repo']}\n")
        if any(r["demonstration"] for r in rows):
            sys.stdout.write("\nbundled-*: demonstration models (a few M parameters, trained on a CPU) that run every "
                             "command offline; not a code assistant (docs/bundled-models.md).\n")
        _families(list_families())


def _fit(json_out: bool) -> None:
    """``codila models --fit``: a row per model: its dtype, what it needs, what the device has, the verdict."""
    from codila_cli.info import list_fit

    rows = list_fit()
    if json_out:
        sys.stdout.write(json.dumps({"schema_version": 1, "command": "models --fit", "models": rows}) + "\n")
        return
    w = max([len("alias"), *(len(r["alias"]) for r in rows)])  # the longest alias sets the column
    sys.stdout.write(f"{'alias':<{w}} {'device':<6} {'dtype':<9} {'needs':>9} {'has':>9}  verdict\n")
    for r in rows:
        if not r["cached"]:
            sys.stdout.write(f"{r['alias']:<{w}} {r['device']:<6} {'-':<9} {'-':>9} {'-':>9}  not in the cache "
                             f"(codila pull {r['alias']})\n")
            continue
        verdict = "fits" if r["fits"] else (f"fits with {r['fits_with']}" if r["fits_with"] else "does not fit")
        sys.stdout.write(f"{r['alias']:<{w}} {r['device']:<6} {r['dtype']:<9} {_size(r['needs_bytes']):>9} "
                         f"{_size(r['has_bytes']):>9}  {verdict} ({r['source']})\n")


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _families(rows: list[dict]) -> None:
    """The families table of ``codila models``: each row what a checkpoint of that family can do."""
    from codila_cli.models.families import VERIFIED

    dw = max(13, *(len(", ".join(f["decoders"])) for f in rows))  # columns as wide as their longest cell
    iw, cw = max(6, *(len(f["infill"]) for f in rows)), max(8, *(len(f["cache"]) for f in rows))
    nw = max(6, *(len(f["name"]) for f in rows))
    sys.stdout.write(f"\n{'family':<{nw}} {'gen --decoder':<{dw}} {'infill':<{iw}} {'plan':<5} {'CoDiLA':<7} "
                     f"{'KV cache':<{cw}} licence\n")
    for f in rows:
        sys.stdout.write(f"{f['name']:<{nw}} {', '.join(f['decoders']):<{dw}} {f['infill']:<{iw}} "
                         f"{'yes' if f['plan'] else 'no':<5} {'yes' if f['codila'] else 'no':<7} {f['cache']:<{cw}} "
                         f"{f['licence']}\n")
    sys.stdout.write("".join(f"  {f['name']}: {f['note']}\n" for f in rows if f["note"]))
    sys.stdout.write("".join(f"  {f['name']} parity: {f['verified']}\n" for f in rows if f["verified"] != VERIFIED))


def doctor(json_out: json_option() = False,
           quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No check table: only the problems (and the exit code).")] = False) -> None:
    """Check versions, device, cache, configured models (with the dtype `auto` picks and the memory their
    weights take) and config file; exit 1 if something is missing or the weights do not fit."""
    from codila_cli.config import load_config
    from codila_cli.info import doctor as run_doctor

    checks, problems = run_doctor(load_config())
    if json_out:
        sys.stdout.write(json.dumps({"schema_version": 1, "command": "doctor", "ok": not problems,
                                     "checks": checks, "problems": problems}) + "\n")
    elif not quiet:
        for c in checks:
            mark = {"ok": "ok  ", "warn": "WARN", "bad": "BAD "}[c["level"]]
            sys.stdout.write(f"{mark} {c['name']:<20} {c['value']}\n")
    for c in checks:
        if c["level"] == "warn":
            what = f"the {c['name']} row above" if not (quiet or json_out) else f"{c['name']}: {c['value']}"
            say(f"Warning: {c['refuses']} will refuse to run here ({what})\n")
    for p in problems:
        say(f"Error: {p}\n")
    if problems:
        if not quiet:
            say("Hint: each Error line above says what is wrong and what to try; "
                             "`codila doctor --json` lists every check\n")
        raise typer.Exit(EXIT_RUNTIME)


def config_path() -> None:
    """Print the config file path ($CODILA_CONFIG or the platform config directory)."""
    from codila_cli.config import config_path as path

    sys.stdout.write(f"{path()}\n")


def config_set(key: Annotated[str, typer.Argument(help="section.key, e.g. gen.block_size or notices.bundled (docs/settings.md).")],
               value: Annotated[str, typer.Argument(help="The value: true/false, a number, text; a comma list for gen.stop.")]) -> None:
    """Set one key in config.toml (created if missing; the rest of the file is kept)."""
    from codila_cli.config import set_value

    path, written = set_value(key, value)
    say(f"{key} = {written!r} in {path}\n")


def config_unset(key: Annotated[str, typer.Argument(help="section.key to remove from config.toml.")]) -> None:
    """Remove one key from config.toml (its default, or what a helper recommends, applies again)."""
    from codila_cli.config import set_value

    path, _ = set_value(key, None)
    say(f"{key} removed from {path}\n")


def config_show(json_out: json_option() = False) -> None:
    """Print every setting with its value and source (env > file > helper's recommendation > default)."""
    from codila_cli.config import load_config
    from codila_cli.info import effective_settings

    user = load_config()
    for w in user.warnings:
        say(f"Warning: {w}\n")
    rows = effective_settings(user)
    if json_out:
        sys.stdout.write(json.dumps({"schema_version": 1, "command": "config show", "path": str(user.path),
                                     "exists": user.exists, "settings": rows}) + "\n")
        return
    for r in rows:
        sys.stdout.write(f"{r['key']:<26} {r['value']!s:<16} ({r['source']})\n")
