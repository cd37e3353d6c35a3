"""Evaluate `codila plan` against `codila gen` on multi-unit tasks from modules outside the training corpus.

    python benchmarks/plan_eval.py --out results/plan [--dlm bundled-plan] [--limit 30]

Tasks: windows of 2–4 top-level functions/classes from the held-out packages (train/corpus.py
HELDOUT_PACKAGES); the prompt is the module docstring's first line (or the first unit's) plus the names
to define, the reference contract comes from static analysis (train/plan_data.py). Settings: plan with
coupled/isolated attention × single/γ 0.99/γ 0.9 commitment, and gen (the same DLM, plain K = 1) on the
same prompt. Metrics: valid share (parses and not empty), share where every identifier of the task's reference
contract is defined, share of runs whose own contract fell back to one unit, Misbound,
Overrun, iterations (DLM forwards) and seconds, each plan setting twice: the model writes the whole
contract, or the task's names are given (`--defines`, the model writes roles, budgets and uses);
"names from the prompt" = share of the task's names
that the run's own contract defines, "units" = entries in it. Rows keep each contract and program. SDDC's Table 3 direction: binding and coupling cut
Misbound.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from codila_cli.contract import Contract, Entry, parse_contract
from codila_cli.decoding.config import DreamConfig
from codila_cli.decoding.plan_config import PlanConfig
from codila_cli.engine.generate import generate
from codila_cli.engine.models import load_models
from codila_cli.engine.tasks import plan
from codila_cli.plan_metrics import all_defined
from codila_cli.train.corpus import collect_sources
from codila_cli.train.plan_data import _units, plan_prompt
from codila_cli.train.prompt_sets import HELDOUT_PACKAGES


def tasks(limit: int) -> list[dict]:
    files, _ = collect_sources(HELDOUT_PACKAGES)
    out = []
    for f in sorted(files, key=lambda f: f.relpath):
        if f.origin == "stdlib":
            continue
        doc, units = _units(f.text)
        simple = [u for u in units if len(u[1]) <= 12 and "_" not in u[1][:1]]
        if len(simple) < 2:
            continue
        window = simple[:3]
        prompt = doc or window[0][3]
        if not prompt:
            continue
        names = [u[1] for u in window]
        contract = Contract(tuple(Entry(i + 1, u[0], 64, (u[1],)) for i, u in enumerate(window)))
        out.append({"id": f.relpath, "prompt": plan_prompt(prompt, names), "contract": contract})
        if len(out) >= limit:
            break
    return out


def _named(reference: Contract, contract_text: str) -> float:
    """Share of the task's names (those its prompt lists) that the run's own contract defines."""
    wanted = {n for e in reference.entries for n in e.defs}
    got = {n for e in parse_contract(contract_text).entries for n in e.defs}
    return len(wanted & got) / len(wanted)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dlm", default="bundled-plan")
    ap.add_argument("--limit", type=int, default=30)
    args = ap.parse_args()
    models = load_models(dlm=args.dlm, ar=None, device="cpu", dtype="float32")
    ts = tasks(args.limit)
    # the model writes the whole contract (names included), or the task's names are given (--defines)
    settings = [(att, com, False) for att in ("coupled", "isolated") for com in (None, 0.99, 0.9)]
    settings += [(att, com, True) for att in ("coupled", "isolated") for com in (None, 0.99, 0.9)]
    rows = []
    for t in ts:
        names = tuple(n for e in t["contract"].entries for n in e.defs)
        for att, com, given in settings:
            cfg = PlanConfig(attention=att, commit=com, max_units=4, defines=names if given else ())
            r = plan(models, t["prompt"], config=cfg, seed=0)
            label = f"plan {att} {'single' if com is None else com}" + (" --defines" if given else "")
            rows.append({"task": t["id"], "setting": label,
                         "valid": r["syntax"].valid and bool(r["text"].strip()),
                         "defined": all_defined(t["contract"], r["text"]),
                         "misbound": r["metrics"]["misbound"], "overrun": r["metrics"]["overrun"],
                         "iterations": r["metrics"]["iterations"], "seconds": r["metrics"]["latency_seconds"],
                         "fallback": r["contract_source"] == "fallback", "units": len(r["units"]),
                         "named": _named(t["contract"], r["contract"]), "contract": r["contract"],
                         "program": r["text"]})
        g = generate(models, t["prompt"] + "\n", decoder="dream", config=DreamConfig(max_new_tokens=256, tokens_per_step=1),
                     seed=0)
        rows.append({"task": t["id"], "setting": "gen dream K=1", "valid": g.syntax.valid and bool(g.completion.strip()),
                     "defined": all_defined(t["contract"], g.text), "misbound": None, "overrun": None,
                     "iterations": g.metrics["dlm_forwards"], "seconds": g.metrics["wall_seconds"], "fallback": None,
                     "units": None, "named": None, "contract": None, "program": g.text})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = ["| setting | n | valid | all defined | names from the prompt | units | Misbound | Overrun | fallback | iterations | seconds |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label in dict.fromkeys(r["setting"] for r in rows):
        rs = [r for r in rows if r["setting"] == label]
        mean = lambda k, rs=rs: statistics.mean(r[k] for r in rs) if rs[0][k] is not None else None
        fmt = lambda v: "–" if v is None else f"{v:.0%}"
        units = "–" if rs[0]["units"] is None else f"{mean('units'):.1f}"
        lines.append(f"| {label} | {len(rs)} | {fmt(mean('valid'))} | {fmt(mean('defined'))} | {fmt(mean('named'))} | "
                     f"{units} | {fmt(mean('misbound'))} | "
                     f"{fmt(mean('overrun'))} | {fmt(mean('fallback'))} | {mean('iterations'):.0f} | {mean('seconds'):.2f} |")
    (args.out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
