"""The held-out prompt set (signature + docstring, code never trained on): syntax validity and speed.

``prompt + completion`` is checked with codila's syntax check (tree-sitter and Python's parser). A
signature + docstring alone is already valid Python, so an empty completion counts as **not** valid
(it is reported separately as ``empty``). This is the CoDiLA paper's Table 1 (syntax-error rate against
tokens per step) in miniature.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable
from importlib import resources
from pathlib import Path

from codila_cli.eval.settings import Setting


def load_heldout(path: Path | None = None) -> list[dict]:
    text = path.read_text(encoding="utf-8") if path else (
        resources.files("codila_cli") / "data" / "heldout_prompts.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def run_heldout(models, prompts: Iterable[dict], settings: list[Setting], *, seed: int = 0,
                on_row: Callable[[dict], None] | None = None) -> list[dict]:
    from codila_cli.runtime import generate

    rows = []
    for st in settings:
        for p in prompts:
            r = generate(models, p["prompt"], decoder=st.decoder, config=st.config, seed=seed)
            empty = not r.completion.strip()
            row = {"task_id": p["id"], "setting": st.label, "decoder": st.decoder,
                   "valid": r.syntax.valid and not empty, "parses": r.syntax.valid, "empty": empty,
                   "completion": r.completion, **{k: r.metrics[k] for k in (
                       "dlm_forwards", "ar_forwards", "tokens", "tokens_per_step", "tokens_per_second",
                       "wall_seconds", "order_spearman")}}
            rows.append(row)
            if on_row:
                on_row(row)
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for label in dict.fromkeys(r["setting"] for r in rows):
        rs = [r for r in rows if r["setting"] == label]
        tokens = sum(r["tokens"] for r in rs)
        secs = sum(r["wall_seconds"] for r in rs)
        fwd = sum(r["dlm_forwards"] for r in rs)
        sp = [r["order_spearman"] for r in rs if r["order_spearman"] is not None]
        out.append({"setting": label, "n": len(rs), "syntax_valid": sum(r["valid"] for r in rs) / len(rs),
                    "syntax_error_rate": 1 - sum(r["parses"] for r in rs) / len(rs),
                    "empty": sum(r["empty"] for r in rs) / len(rs),
                    "tokens_per_step": tokens / fwd if fwd else 0.0, "tokens_per_second": tokens / secs if secs else 0.0,
                    "dlm_forwards": fwd, "ar_forwards": sum(r["ar_forwards"] for r in rs),
                    "order_spearman": statistics.mean(sp) if sp else None, "wall_seconds": secs})
    return out


def markdown(summary: list[dict]) -> str:
    lines = ["| setting | n | valid (parses, non-empty) | syntax errors | empty | tokens/step | tokens/s | DLM fwd | AR fwd | order ρ |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        rho = f"{s['order_spearman']:.2f}" if s["order_spearman"] is not None else "–"
        lines.append(f"| `{s['setting']}` | {s['n']} | {s['syntax_valid']:.1%} | {s['syntax_error_rate']:.1%} | {s['empty']:.1%} | "
                     f"{s['tokens_per_step']:.2f} | {s['tokens_per_second']:.1f} | {s['dlm_forwards']} | "
                     f"{s['ar_forwards']} | {rho} |")
    return "\n".join(lines) + "\n"


def pareto_plot(summary: list[dict], png: Path, *, quality: str = "syntax_valid") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    ax.set_ylabel(f"{quality.replace('_', ' ')} (%)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
