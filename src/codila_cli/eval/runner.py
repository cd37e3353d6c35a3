"""`codila eval`: tasks × decoder settings → JSONL rows, a Markdown summary and a Pareto plot.

One row per (task, setting): completion, syntax validity of the program, pass (sandboxed execution,
when the task has tests), and the decoder metrics. pass@1 is the mean of ``passed`` with one greedy
sample per task.
"""

from __future__ import annotations

import io
import json
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from codila_cli.atomic import write_bytes_atomic, write_text_atomic
from codila_cli.eval.benchmarks import Task
from codila_cli.eval.sandbox import SandboxLimits, run_sandboxed
from codila_cli.eval.settings import Setting

ROW_KEYS = ("task_id", "setting", "decoder", "completion", "valid", "parses", "empty", "repetitive", "passed", "status", "verdict",
            "dlm_forwards", "ar_forwards", "tokens", "tokens_per_step", "tokens_per_second", "wall_seconds",
            "order_spearman")


def evaluate_task(models, task: Task, setting: Setting, *, seed: int, limits: SandboxLimits) -> dict:
    from codila_cli.engine.generate import generate
    from codila_cli.engine.tasks import infill_tokens

    _check_fit(task, setting)
    if task.kind == "infill":
        res, _, _ = infill_tokens(models, task.prompt, task.suffix, config=setting.config, seed=seed)
        completion = models.dlm.tokenizer.decode(res.middle, skip_special_tokens=True)
        decided = len(res.middle) + res.deletions + res.expansions
        metrics = {"dlm_forwards": res.dlm_forwards, "ar_forwards": res.ar_forwards, "tokens": decided,
                   "tokens_per_step": decided / res.dlm_forwards if res.dlm_forwards else 0.0,
                   "tokens_per_second": decided / res.seconds if res.seconds else 0.0,
                   "wall_seconds": res.seconds, "order_spearman": None}
        return _row(task, setting, completion, metrics, limits)
    r = generate(models, task.prompt, decoder=setting.decoder, config=_with_stop(models, setting, task.stop), seed=seed)
    return _row(task, setting, r.completion if r.mode == "raw" else r.text, r.metrics, limits)


def _with_stop(models, setting: Setting, stop: tuple[str, ...]) -> Any:
    """The setting's decoder config with the task's stop lines (the setting's own, if it has any, win).
    Only for raw completion: a chat model answers with a whole program in a fence, whose top-level
    ``def`` must not end it."""
    from dataclasses import replace

    from codila_cli.engine.prompts import is_chat

    cfg = setting.config
    if not stop or not hasattr(cfg, "stop") or cfg.stop or is_chat(models.dlm.tokenizer):
        return cfg
    return replace(cfg, stop=stop)


def evaluate_batch(models, tasks: list[Task], setting: Setting, *, seed: int, limits: SandboxLimits) -> list[dict]:
    """Several completion tasks decoded together (engine.generate.generate_many: each step's model calls,
    KV-cached ones included, run as stacked forwards); each row equals its single run up to float
    rounding in the packed matrix products."""
    for task in tasks:
        _check_fit(task, setting)
    long = [too_long(models, t, setting) for t in tasks]  # such a task counts as failed, undecoded
    rows = iter(_decode_rows(models, [t for t, skip in zip(tasks, long) if not skip], setting, seed=seed,
                             limits=limits))
    return [_too_long_row(t, setting) if skip else next(rows) for t, skip in zip(tasks, long)]


def _decode_rows(models, tasks: list[Task], setting: Setting, *, seed: int, limits: SandboxLimits) -> list[dict]:
    from codila_cli.engine.generate import generate_many

    # one config serves a batch, so its tasks must share their stop lines (a benchmark's tasks do)
    if len(tasks) <= 1 or any(t.kind == "infill" for t in tasks) or len({t.stop for t in tasks}) > 1:
        return [evaluate_task(models, t, setting, seed=seed, limits=limits) for t in tasks]
    out = generate_many(models, [t.prompt for t in tasks], decoder=setting.decoder,
                        config=_with_stop(models, setting, tasks[0].stop), seeds=[seed] * len(tasks))
    return [_row(t, setting, r.completion if r.mode == "raw" else r.text, r.metrics, limits)
            for t, r in zip(tasks, out.results)]


def too_long(models, task: Task, setting: Setting) -> bool:
    """True when a completion task's prompt plus the setting's canvas does not fit the DLM's context.
    (An infill task never is: its prefix and suffix are cut to fit around the middle.)"""
    from codila_cli.engine.generate import context_overflow

    if task.kind == "infill" or not hasattr(setting.config, "max_new_tokens"):  # (a mismatch: _check_fit)
        return False
    return context_overflow(models, task.prompt, config=setting.config) is not None


def _too_long_row(task: Task, setting: Setting) -> dict:
    """The row of a task the model cannot take at this canvas length: nothing decoded, counted as failed
    (not valid, not passed), so every benchmark's denominators stay the whole benchmark."""
    return {"task_id": task.task_id, "setting": setting.label, "decoder": setting.decoder, "completion": "",
            "valid": False, "parses": False, "empty": True, "repetitive": False,
            "passed": False if task.test else None, "status": "too-long", "verdict": None, "dlm_forwards": 0, "ar_forwards": 0,
            "tokens": 0, "tokens_per_step": 0.0, "tokens_per_second": 0.0, "wall_seconds": 0.0,
            "order_spearman": None}


def _check_fit(task: Task, setting: Setting) -> None:
    if (task.kind == "infill") != (setting.decoder == "dreamon"):
        raise ValueError(f"setting {setting.label!r} does not fit task {task.task_id} (infill tasks need dreamon:…)")


def repetitive(text: str, *, n: int = 4, floor: float = 0.5, min_grams: int = 8) -> bool:
    """True when the text is mostly one pattern repeated: fewer than ``floor`` of its word-level
    n-grams are distinct (``self._file = self._file = …``, ``_for_for_for…``). Parsing code can still be
    degenerate; this flag keeps the valid share honest."""
    import re

    words = re.findall(r"[A-Za-z]+|\d+|[^\sA-Za-z\d]", text)
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return len(grams) >= min_grams and len(set(grams)) / len(grams) < floor


def row_outcome(row: dict) -> str:
    """A row in words, the verdict first: ``passed`` / ``FAILED`` (with its status) when the task's tests
    ran, then whether the program parses; a task without tests says so instead of implying a pass."""
    shape = "empty" if row.get("empty") else ("parses" if row.get("parses") else "does not parse")
    status = row.get("status")
    if row.get("passed") is True:
        return f"passed · {shape}"
    if row.get("passed") is False:
        return f"FAILED{'' if status in (None, 'failed') else f' ({status})'} · {shape}"
    return f"no tests run · {shape}"


def _row(task: Task, setting: Setting, completion: str, metrics: dict, limits: SandboxLimits) -> dict:
    from codila_cli.syntax import check_python

    body = task.body(completion)  # the program without its tests
    start = len(task.prompt) if task.kind in ("complete", "infill") else 0
    report = check_python(body, span=(start, start + len(completion)))
    parses = report.valid
    empty = not completion.strip()
    row = {"task_id": task.task_id, "setting": setting.label, "decoder": setting.decoder, "completion": completion,
           "valid": parses and not empty, "parses": parses, "empty": empty, "repetitive": repetitive(completion),
           "warnings": [f"{w.line}:{w.column} {w.message}" for w in report.warnings],
           "passed": None, "status": "no-tests", "verdict": None}
    if task.test:
        out = _judge(task, completion, limits)
        row["passed"], row["status"], row["verdict"] = out.passed, out.status, out.verdict
        if out.detail:
            row["failure"] = out.detail
    row.update({k: metrics[k] for k in ("dlm_forwards", "ar_forwards", "tokens", "tokens_per_step",
                                       "tokens_per_second", "wall_seconds", "order_spearman")})
    return row


def _judge(task: Task, completion: str, limits: SandboxLimits):
    """The task's verdict on one completion. Whatever the program did, the run goes on: a sandbox that
    cannot start or clean up (out of descriptors, a cgroup that will not go) is that row's error."""
    from codila_cli.errors import CodilaError
    from codila_cli.eval.sandbox import Outcome
    from codila_cli.eval.verdict import reference_for

    try:
        return run_sandboxed(task.body(completion), limits, test=task.test, entry_point=task.entry_point,
                             reference=reference_for(kind=task.kind, prompt=task.prompt, reference=task.reference),
                             isolated=task.verdict == "isolated")
    except CodilaError:
        raise
    except Exception as exc:  # noqa: BLE001 - one program's aftermath never ends the run
        return Outcome(False, "error", None, 0.0, "", f"the sandbox failed: {type(exc).__name__}: {exc}"[:300],
                       verdict=task.verdict)


def run_eval(models, tasks: list[Task], settings: list[Setting], *, seed: int = 0,
             limits: SandboxLimits | None = None, on_row: Callable[[dict], None] | None = None,
             rank: int = 0, world: int = 1, batch_size: int = 1) -> list[dict]:
    """Rows for every (setting, task), returned in (setting, task) order; with ``world`` > 1 only this
    rank's share (tasks rank::world); with ``batch_size`` > 1 completion tasks are decoded
    ``batch_size`` at a time.

    The run is task-major: every setting decodes a task (or a batch of tasks) before the next one
    starts, so the settings' tokens/s are measured side by side. Run setting after setting, a machine
    whose speed drifts over minutes (a shared VM, a GPU warming up) times each setting in a different
    phase: on this project's 2-core VM the same setting ran 25 % slower when it came second."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    limits = limits if limits is not None else SandboxLimits()
    rows = []
    mine = [(ti, task) for ti, task in enumerate(tasks) if ti % world == rank]
    for b in range(0, len(mine), batch_size):
        chunk = mine[b : b + batch_size]
        for si, st in enumerate(settings):
            for (ti, _), row in zip(chunk, evaluate_batch(models, [t for _, t in chunk], st, seed=seed, limits=limits)):
                row["_setting_index"], row["_task_index"] = si, ti
                rows.append(row)
                if on_row:
                    on_row(row)
    return sorted(rows, key=lambda r: (r["_setting_index"], r["_task_index"]))


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for label in dict.fromkeys(r["setting"] for r in rows):
        rs = [r for r in rows if r["setting"] == label]
        n = len(rs)
        tested = [r for r in rs if r["passed"] is not None]
        tokens, secs = sum(r["tokens"] for r in rs), sum(r["wall_seconds"] for r in rs)
        fwd = sum(r["dlm_forwards"] for r in rs)
        sp = [r["order_spearman"] for r in rs if r["order_spearman"] is not None]
        out.append({
            "setting": label, "n": n,
            "pass_at_1": (sum(bool(r["passed"]) for r in tested) / len(tested)) if tested else None,
            "syntax_valid": sum(r["valid"] for r in rs) / n, "syntax_error_rate": 1 - sum(r["parses"] for r in rs) / n,
            "valid_not_repetitive": sum(r["valid"] and not r.get("repetitive", False) for r in rs) / n,
            "empty": sum(r["empty"] for r in rs) / n, "tokens_per_step": tokens / fwd if fwd else 0.0,
            "static_findings": sum(bool(r.get("warnings")) for r in rs) / n,  # parses, but pyflakes finds something
            "tokens_per_second": tokens / secs if secs else 0.0, "dlm_forwards": fwd,
            "ar_forwards": sum(r["ar_forwards"] for r in rs), "order_spearman": statistics.mean(sp) if sp else None,
            "wall_seconds": round(secs, 2), "too_long": sum(r.get("status") == "too-long" for r in rs),
            "in_process": sum(r.get("verdict") == "in-process" for r in rs)})
    return out


SPEED_KEYS = ("cache", "cb")  # setting keys that make a decode faster without changing what it aims at


def reference_label(label: str) -> str | None:
    """The same setting without its speed-ups (``codila:B=4,cache=dual,cb=4`` -> ``codila:B=4``), or
    None if ``label`` has none."""
    name, _, args = label.partition(":")
    parts = [a for a in args.split(",") if a]
    kept = [a for a in parts if a.partition("=")[0].strip() not in SPEED_KEYS]
    if len(kept) == len(parts):
        return None
    return f"{name}:{','.join(kept)}" if kept else name


def _mcnemar(lost: int, gained: int) -> float:
    """Exact two-sided McNemar p-value: the chance of a split at least this uneven among the tasks that
    flipped, if flipping either way were equally likely."""
    n = lost + gained
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(lost, gained) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired_quality(rows: list[dict]) -> list[dict]:
    """Each faster setting against the same setting without the speed-up, task by task (issue 10: the
    valid share and pass@1 must hold). On the tasks both ran: identical completions, tasks that lost
    or gained validity (and a pass), the change in points, and McNemar's p for each: a difference of a
    few points on ~100 tasks is usually within what chance flips give."""
    by = {(r["setting"], r["task_id"]): r for r in rows}
    labels = list(dict.fromkeys(r["setting"] for r in rows))
    out = []
    for label in labels:
        ref = reference_label(label)
        if ref is None or ref not in labels:
            continue
        pairs = [(by[(ref, t)], r) for (lab, t), r in by.items() if lab == label and (ref, t) in by]
        if not pairs:
            continue
        lost = sum(a["valid"] and not b["valid"] for a, b in pairs)
        gained = sum(b["valid"] and not a["valid"] for a, b in pairs)
        tested = [(a, b) for a, b in pairs if a["passed"] is not None and b["passed"] is not None]
        p_lost = sum(bool(a["passed"]) and not b["passed"] for a, b in tested)
        p_gained = sum(bool(b["passed"]) and not a["passed"] for a, b in tested)
        out.append({"setting": label, "reference": ref, "n": len(pairs),
                    "identical": sum(a["completion"] == b["completion"] for a, b in pairs),
                    "valid_lost": lost, "valid_gained": gained, "valid_delta_points": 100 * (gained - lost) / len(pairs),
                    "valid_p": _mcnemar(lost, gained), "tested": len(tested), "pass_lost": p_lost, "pass_gained": p_gained,
                    "pass_delta_points": 100 * (p_gained - p_lost) / len(tested) if tested else None,
                    "pass_p": _mcnemar(p_lost, p_gained) if tested else None})
    return out


def paired_section(paired: list[dict]) -> str:
    """The paired table under its heading line, or "" when no setting has a reference."""
    if not paired:
        return ""
    return "\nPaired with the same setting without the speed-up (McNemar's exact p):\n\n" + paired_markdown(paired)


def paired_markdown(paired: list[dict]) -> str:
    lines = ["| setting | against | tasks | identical | valid: lost / gained | Δ valid | p | pass: lost / gained | Δ pass@1 | p |",
             "|" + "---|" * 10]
    for q in paired:
        if q["tested"]:
            passed = f"{q['pass_lost']} / {q['pass_gained']} | {q['pass_delta_points']:+.1f} | {q['pass_p']:.2f}"
        else:
            passed = "– | – | –"
        lines.append(f"| `{q['setting']}` | `{q['reference']}` | {q['n']} | {q['identical']} | "
                     f"{q['valid_lost']} / {q['valid_gained']} | {q['valid_delta_points']:+.1f} | {q['valid_p']:.2f} | {passed} |")
    return "\n".join(lines) + "\n"


def markdown(summary: list[dict], *, title: str = "") -> str:
    head = ("| setting | n | pass@1 | valid (parses, non-empty) | valid, not repetitive | syntax errors | empty "
            "| tokens/step | tokens/s | DLM fwd | AR fwd | order ρ | seconds |")
    lines = ([f"### {title}", ""] if title else []) + [head, "|" + "---|" * 13]
    for s in summary:
        p = f"{s['pass_at_1']:.1%}" if s["pass_at_1"] is not None else "–"
        rho = f"{s['order_spearman']:.2f}" if s["order_spearman"] is not None else "–"
        lines.append(f"| `{s['setting']}` | {s['n']} | {p} | {s['syntax_valid']:.1%} | "
                     f"{s.get('valid_not_repetitive', s['syntax_valid']):.1%} | {s['syntax_error_rate']:.1%} | "
                     f"{s['empty']:.1%} | {s['tokens_per_step']:.2f} | {s['tokens_per_second']:.1f} | "
                     f"{s['dlm_forwards']} | {s['ar_forwards']} | {rho} | {s['wall_seconds']} |")
    long = max((s.get("too_long", 0) for s in summary), default=0)
    if long:
        lines += ["", (f"{long} task(s) did not fit the model's context with this canvas (status `too-long` in "
                       "rows.jsonl): nothing was decoded for them and they count as failed.")]
    inproc = max((s.get("in_process", 0) for s in summary), default=0)
    if inproc:
        lines += ["", (f"{inproc} task(s) were judged in-process (`verdict: in-process` in rows.jsonl): their tests ran "
                       "inside the program's own process, where a program can forge a pass (docs/evaluation.md).")]
    return "\n".join(lines) + "\n"


def pareto_plot(summary: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    quality = "pass_at_1" if all(s["pass_at_1"] is not None for s in summary) else "syntax_valid"
    fig, ax = plt.subplots(figsize=(6.5, 4))
    groups: dict[str, list[dict]] = {}
    for s in summary:
        groups.setdefault(s["setting"].split(":")[0], []).append(s)
    for name, ss in groups.items():
        ss = sorted(ss, key=lambda s: s["tokens_per_second"])
        ax.plot([s["tokens_per_second"] for s in ss], [100 * s[quality] for s in ss], "o-", label=name)
        for s in ss:
            ax.annotate(s["setting"].split(":", 1)[-1], (s["tokens_per_second"], 100 * s[quality]), fontsize=7,
                        textcoords="offset points", xytext=(3, 3))
    ax.set_xlabel("tokens / s")
    ax.set_ylabel(("pass@1" if quality == "pass_at_1" else "valid (parses, non-empty)") + " (%)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_bytes_atomic(png, buf.getvalue())


def write_outputs(out_dir: Path, rows: list[dict], *, title: str, provenance: dict | None = None) -> list[dict]:
    """rows.jsonl, summary.json / .md, paired.json, pareto.png and, given ``provenance`` (provenance.py),
    provenance.json and the summary's last line: what made the numbers."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # each file whole or not at all (a full disk or a Ctrl-C leaves the previous run's file, not half of one)
    write_text_atomic(out_dir / "rows.jsonl", "".join(
        json.dumps({k: v for k, v in r.items() if not k.startswith("_")}) + "\n" for r in rows))
    summary = summarize(rows)
    paired = paired_quality(rows)
    write_text_atomic(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    if paired:  # each faster setting against itself without the speed-up, task by task
        write_text_atomic(out_dir / "paired.json", json.dumps(paired, indent=2) + "\n")
    made = ""
    if provenance is not None:
        from codila_cli.provenance import provenance_line

        write_text_atomic(out_dir / "provenance.json", json.dumps(provenance, indent=2) + "\n")
        made = "\n" + provenance_line(provenance) + "\n"
    write_text_atomic(out_dir / "summary.md", markdown(summary, title=title) + paired_section(paired) + made)
    pareto_plot(summary, out_dir / "pareto.png")
    return summary
