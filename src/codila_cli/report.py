"""The status lines commands write on stderr, built as strings (the commands print them): the syntax
report, ``-v``'s settings, forwards and timings, and the process's peak memory."""

from __future__ import annotations

import sys
from typing import Any

from codila_cli.ui.terminal import say


def syntax_line(report: Any, *, named: bool = False) -> str:
    """What the check found, in its own words: ``syntax: parses`` (and nothing more is claimed), with the
    static findings in the generated code if any (``… parses; 2 warnings: line 3 col 5: undefined name
    'b'; …``), or ``syntax: does not parse`` with the first five problems, each with its line and column
    and, where known, whether it lies in the user's own text."""
    def listed(items: Any, text: Any) -> str:
        more = f" (+{len(items) - 5} more)" if len(items) > 5 else ""
        return "; ".join(text(i) for i in items[:5]) + more

    if not getattr(report, "checked", True):
        return (f"syntax: not checked (codila has no grammar for {report.language})" if report.language else
                "syntax: not checked (the language is unknown; --language names it)")
    lang = getattr(report, "language", "python")
    shown = f" ({lang})" if lang is not None and (lang != "python" or named) else ""  # named: --language said it
    if report.valid:
        warnings = getattr(report, "warnings", ())
        if not warnings:
            return f"syntax: parses{shown}"
        wrong = [w for w in warnings if w.kind == "looks-wrong"]
        flakes = [w for w in warnings if w.kind != "looks-wrong"]
        parts = [f"looks wrong: {listed(wrong, lambda w: f'line {w.line}: {w.message}')}"] if wrong else []
        if flakes:
            parts.append(f"{len(flakes)} warning{'s' if len(flakes) > 1 else ''} (pyflakes): "
                         + listed(flakes, lambda w: f"line {w.line} col {w.column}: {w.message}"))
        return f"syntax: parses{shown}; " + "; ".join(parts)
    return (f"syntax: does not parse{shown}, {len(report.errors)} problem(s): "
            + listed(report.errors, lambda e: f"line {e.line} col {e.column}: {e.message or e.kind}"
                     + (" (in the given text)" if getattr(e, "where", "") == "given" else "")))


def unchecked_note(prompt: str) -> str:
    """What follows ``syntax: parses`` when nothing ran the code: that nothing did, and what would."""
    from codila_cli.checks import prompt_doctests

    n = prompt_doctests(prompt)
    return ("; what it does is unchecked" + (f" (--check runs the prompt's {n} doctest{'s' if n > 1 else ''})"
                                              if n else ""))


def check_line(check: Any) -> tuple[str, bool]:
    """``gen --check``'s line and whether it held."""
    if check.total == 0:
        return "check: the prompt has no doctests (>>> examples); nothing was run", False
    if check.passed:
        return f"check: the prompt's {check.total} doctest{'s pass' if check.total > 1 else ' passes'}", True
    detail = f": {check.detail}" if check.detail else ""
    return f"check: FAILED ({check.status}){detail}", False


def clean(report: Any) -> bool:
    """Parses and has no static finding in the generated code: what ``--strict`` asks for (a text that
    was not checked is not clean)."""
    return bool(getattr(report, "checked", True) and report.valid and not getattr(report, "warnings", ()))


def peak_memory() -> str:
    """The process's peak resident memory, and the GPU's peak allocation when torch runs on CUDA."""
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 1024**2)
    out = f"peak RSS {rss:.0f} MiB"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        out += f", peak GPU {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB"
    return out


def settings_line(decoder: str, cfg: Any, models: Any) -> str:
    """``-v``: the decoder's settings in eval's setting syntax (the knobs the table marks ``show``, and every
    other one that is not its default; decoding/config.py) and where each model runs, in what dtype (and
    with what quantized weights);
    `--json`'s ``settings`` has every value."""
    from codila_cli.decoding.config import GEN_KNOBS
    from codila_cli.decoding.knobs import flat, label_parts

    values = flat(cfg)
    parts = label_parts(GEN_KNOBS, {k: v for k, v in values.items() if k not in ("max_new_tokens",)})
    if decoder == "dream" and values.get("steps") is None and values.get("tokens_per_step") is None:
        parts.insert(0, f"steps={values['max_new_tokens']}")  # Dream's default schedule: one token per step
    where = [f"{role}: {m.name} ({m.device}, {str(m.ckpt.dtype).removeprefix('torch.')}{_bits(m.ckpt)})"
             for role, m in (("dlm", models.dlm), ("ar", models.ar)) if m is not None]
    torch = sys.modules.get("torch")
    if torch is not None:
        where.append(f"threads: {torch.get_num_threads()}")  # engine/threads.py (--threads, CODILA_THREADS)
    return f"settings: {decoder}:" + ",".join(parts) + "  " + "  ".join(where)


def _bits(ckpt: Any) -> str:
    """", int8 weights" for a quantized checkpoint (models/quantize.py), and why ``--dtype auto`` chose its
    dtype (engine/models.py::plan_load), e.g. "; auto: bf16: bf16 ran 2.3× fp32's speed on this CPU (probe)"."""
    scheme, note = getattr(ckpt, "quantize", "none"), getattr(ckpt, "dtype_note", "")
    return ("" if scheme == "none" else f", {scheme} weights") + (f"; auto: {note}" if note else "")


def sources_line(sources: dict[str, str], cfg: Any) -> str | None:
    """``-v``: each setting that no flag gave and that is not codila's default, with its layer
    (env = CODILA_*, config = config.toml, helper = the AR helper's recommendation, model = the DLM's
    generation_config)."""
    from codila_cli.decoding.config import GEN_KNOBS
    from codila_cli.decoding.knobs import flat

    values = flat(cfg)
    quiet = lambda key, where: where.startswith("follows ") and values[key] == GEN_KNOBS[key].default
    parts = [f"{key}={values[key]} ({where})" for key, where in sources.items()
             if where not in ("default", "flag") and key in values and not quiet(key, where)]
    return "sources: " + "  ".join(parts) if parts else None


def unfinished_note(max_new_tokens: int) -> str:
    return f"the canvas (--max-new-tokens {max_new_tokens}) filled up before the model wrote its end"


def gen_verbose_lines(result: Any, decoder: str, cfg: Any, models: Any, sources: dict[str, str] | None = None) -> list[str]:
    """``gen -v`` for one sample: seed and prompt size, settings (and where they came from), forwards,
    speed and memory."""
    m = result.metrics
    where = sources_line(sources or {}, cfg)
    return [f"seed: {result.seed}  decoder: {decoder}  prompt tokens: {result.prompt_tokens}",
            settings_line(decoder, cfg, models), *([where] if where else []),
            (f"dlm forwards: {m['dlm_forwards']}  ar forwards: {m['ar_forwards']}  tokens: {m['tokens']}  "
             f"tokens/step: {m['tokens_per_step']:.2f}  tokens/s: {m['tokens_per_second']:.1f}  "
             f"decode: {m['wall_seconds']:.2f}s  load: {m['load_seconds']:.2f}s  {peak_memory()}"),
            *([exact_line(m)] if m.get("freedave") else [])]


def exact_line(m: dict) -> str:
    """``-v`` under ``--exact``: the sequential forwards, what they evaluated, and what verification did."""
    f = m["freedave"]
    return (f"exact (FreeDave): {m['dlm_forwards']} sequential forwards ({m['tokens_per_step']:.2f} tokens each) "
            f"evaluating {m['dlm_rows']} canvases; drafts accepted {f['accepted']} of {f['drafted']}; "
            f"{f['guarded']} near ties decided alone")


def samples_summary_line(outcome: Any, n: int, max_new_tokens: int) -> tuple[str, bool]:
    """``gen -n``: how many samples parse (and how many ran out of canvas); True when all parse."""
    results = outcome.results
    valid = sum(r.syntax.valid for r in results)
    unfinished = sum(not r.syntax.valid and not r.metrics["ended"] for r in results)
    note = (f"; the model had not finished {unfinished} of them when the canvas was full (--max-new-tokens "
            f"{max_new_tokens})" if unfinished else "")
    return f"{valid} of {n} samples parse{note}", valid == n


def samples_verbose_lines(outcome: Any, seeds: list[int], decoder: str, cfg: Any, models: Any) -> list[str]:
    """``gen -n -v``: seeds, whether the samples shared forwards, row forwards, speed and memory."""
    b = outcome.summary()
    how = f"batched dlm forwards: {b['batched_dlm_forwards']}" if outcome.batched else "one sample after another"
    return [(f"seeds: {seeds[0]}..{seeds[-1]}  decoder: {decoder}  {how}  row forwards: {b['row_dlm_forwards']}"
             f"  tokens: {b['tokens']}  tokens/s: {b['tokens_per_second']:.1f}"
             f"  decode: {b['wall_seconds']:.2f}s  {peak_memory()}"), settings_line(decoder, cfg, models)]


# no aligned helper is published: a real pair's helper is one the user makes (README, docs/training.md)
_PAIR = "--dlm dream-coder + codila train align"
REAL_MODELS = {"gen": _PAIR, "eval": _PAIR, "infill": "--dlm dreamon", "plan": "--dlm dream-coder", "serve": _PAIR}


def bundled_notice(models: Any, user: Any, *, quiet: bool, command: str = "gen") -> str | None:
    """The one stderr line (under 130 characters) saying that demonstration models run and what the
    command's real model is. None when no bundled model runs, with -q, with ``CODILA_NOTICE=0`` or with
    ``notices.bundled = false`` (``codila config set notices.bundled false``)."""
    import os

    names = getattr(models, "bundled", ())
    if quiet or not names or user.get("notices", "bundled") is False or os.environ.get("CODILA_NOTICE") == "0":
        return None
    what = "are demo models" if len(names) > 1 else "is a demo model"
    return (f"Note: {' + '.join(names)} {what}; for real use: {REAL_MODELS.get(command, REAL_MODELS['gen'])} "
            "(hide: CODILA_NOTICE=0)")


def _to_width(line: str) -> str:
    """``line`` wrapped at spaces to the terminal's width when stderr is one (a terminal breaks a long line
    mid-word: issue 63 at 60 columns); unchanged otherwise."""
    import textwrap

    from codila_cli.ui.terminal import stderr_is_tty, terminal_width

    if not stderr_is_tty():
        return line
    return textwrap.fill(line, width=max(20, terminal_width() - 1), break_long_words=False, break_on_hyphens=False)


def note_bundled(models: Any, *, quiet: bool, user: Any = None, command: str = "gen") -> None:
    """Write :func:`bundled_notice` to stderr (once per command, after the models load), and the warning of
    a ``--threads`` count over the free cores (engine/threads.py::over_free)."""
    if user is None:
        from codila_cli.config import load_config

        user = load_config()
    line = bundled_notice(models, user, quiet=quiet, command=command)
    if line:
        say(_to_width(line) + "\n")
    if getattr(models, "threads_note", None) and not quiet:
        say(f"Warning: {models.threads_note}\n")
