"""--exact for DreamOn infilling (decoding/freedave.py::fill_exact, FreeDave arXiv 2510.00294): DreamOn's steps,
its expands and deletes included, in fewer sequential forwards: on seeded random fills of a tiny model that
expands and deletes (each step compared with the reference's), fp32 and bf16, with a batch that rounds otherwise,
through `codila infill` and `codila eval` (a real server: tests/test_freedave.py); and what is refused."""

from __future__ import annotations

import json
import random

import pytest
import torch
from typer.testing import CliRunner

from codila_cli.cli import app
from codila_cli.decoding.config import InfillConfig, SamplingConfig
from codila_cli.decoding.dreamon import decode_dreamon
from codila_cli.decoding.freedave import fill_exact
from codila_cli.decoding.metrics import MetricsRecorder


def resizing_dlm(tiny: dict, dtype: torch.dtype):
    """The tiny random DreamOn-shaped model with its ``<|expand|>`` and end-of-text head rows scaled up (×4, ×2),
    so that its fills expand and delete as a trained DreamOn's do (a random head almost never picks them)."""
    from codila_cli.models.families import load_dlm

    dlm = load_dlm(tiny["dlm"], name="tiny-dreamon", device=torch.device("cpu"), dtype=dtype)
    assert dlm.specials.expand is not None
    with torch.no_grad():
        dlm.model.lm_head.weight[dlm.specials.expand] *= 4
        dlm.model.lm_head.weight[dlm.specials.eos] *= 2
    return dlm


def random_fill(rng: random.Random, vocab: int) -> tuple[list[int], list[int], InfillConfig]:
    most = rng.choice([4, 8, 16, 32])
    cfg = InfillConfig(initial_masks=rng.randrange(0, most + 1), max_middle_tokens=most,
                       tokens_per_step=rng.choice([1, 1, 2]), expand_budget=rng.choice([None, 0, 2]),
                       broadcast_delete=rng.random() < 0.5, alg=rng.choice(["entropy", "maskgit_plus", "topk_margin"]),
                       steps=rng.choice([None, None, 5]),
                       sampling=SamplingConfig(top_k=rng.choice([None, 5]), top_p=rng.choice([None, 0.9])))
    def text() -> list[int]:
        return [rng.randrange(6, vocab) for _ in range(rng.randrange(0, 12))]
    return text(), text(), cfg


def assert_same_fill(dlm, prefix: list[int], suffix: list[int], config: InfillConfig) -> dict:
    """The exact fill commits DreamOn's steps in its order (positions, tokens, and the middle each leaves, so
    every expand and delete too), in no more sequential forwards than the reference's plus its near ties."""
    ref_events, ex_events = MetricsRecorder(), MetricsRecorder()
    ref = decode_dreamon(dlm, prefix_ids=prefix, suffix_ids=suffix, config=config, on_step=ref_events)
    ex = fill_exact(dlm, prefix_ids=prefix, suffix_ids=suffix, config=config, on_step=ex_events)
    steps = [[(e.step, e.positions, e.tokens, e.canvas) for e in r.events] for r in (ref_events, ex_events)]
    assert steps[1] == steps[0], config
    assert (ex.middle, ex.expansions, ex.deletions, ex.truncated, ex.steps) == \
           (ref.middle, ref.expansions, ref.deletions, ref.truncated, ref.steps)
    assert ex.dlm_forwards <= ref.dlm_forwards + ex.freedave["guarded"] + 1
    assert ex.freedave["forwards"] == ex.dlm_forwards and ex.dlm_rows >= ex.dlm_forwards
    return {"ref": ref.dlm_forwards, "exact": ex.dlm_forwards, "expansions": ref.expansions,
            "deletions": ref.deletions, "guarded": ex.freedave["guarded"]}


def _property(tiny: dict, n: int, dtype: torch.dtype, seed0: int = 0) -> dict:
    dlm = resizing_dlm(tiny, dtype)
    totals = dict.fromkeys(("ref", "exact", "expansions", "deletions", "guarded"), 0)
    for seed in range(seed0, seed0 + n):
        for k, v in assert_same_fill(dlm, *random_fill(random.Random(seed), min(dlm.vocab_rows, 400))).items():
            totals[k] += v
    return totals


def test_every_deterministic_dreamon_golden_case_gives_the_official_middle(monkeypatch):
    """The DreamOn goldens (tests/fixtures/dreamon: DreamOn's own generator on two small checkpoints) that run at
    temperature 0, fp32 and bf16, run by their harness (parity_cases.run_dreamon) with the loop swapped for
    FreeDave: the official middle, in no more sequential forwards (one more per near tie decided alone)."""
    from parity_cases import DREAMON, DREAMON_TOPK, run_dreamon
    from test_parity import _dreamon_target

    from codila_cli.decoding import dreamon

    cases = [c for c in DREAMON + DREAMON_TOPK if not c["settings"]["temperature"]]
    assert len(cases) >= 10 and {c["dtype"] for c in cases} == {"float32", "bfloat16"}
    guarded: list[int] = []

    def exact(dlm, *, prefix_ids, suffix_ids, config, writer=None, generator=None, on_step=None):
        res = fill_exact(dlm, prefix_ids=prefix_ids, suffix_ids=suffix_ids, config=config)
        guarded.append(res.freedave["guarded"])
        return res

    monkeypatch.setattr(dreamon, "decode_dreamon", exact)
    saved = 0
    for case in cases:
        want, want_forwards = _dreamon_target(case)
        middle, forwards = run_dreamon(case)
        assert middle == want, case["id"]
        assert forwards <= want_forwards + guarded[-1], case["id"]
        saved += want_forwards - forwards
    assert saved > 0


def test_random_fills_commit_dreamons_steps_in_fp32(tiny):
    """200 seeded random fills (middle sizes, budgets, K, broadcast deletion, confidence rules, step caps):
    every step is the reference's, the cases do expand and delete, and in all they take fewer sequential forwards."""
    totals = _property(tiny, 200, torch.float32)
    assert totals["expansions"] > 50 and totals["deletions"] > 50
    assert totals["exact"] < totals["ref"]


@pytest.mark.slow
def test_thousands_of_random_fills(tiny):
    totals = _property(tiny, 2000, torch.float32, seed0=10_000)
    assert totals["exact"] < totals["ref"]


def test_random_fills_in_bf16(tiny):
    """In bf16 a batched forward rounds rows otherwise than a lone one, so every decision read from a batch must
    clear the bf16 tolerance or is taken from the canvas's own forward: these cases keep the reference's steps."""
    totals = _property(tiny, 40, torch.bfloat16, seed0=5_000)
    assert totals["expansions"] > 0 and totals["deletions"] > 0


def test_a_batch_that_rounds_otherwise_is_caught_in_a_fill(tiny, monkeypatch):
    """Batched rows (d > 1) nudged by 1e-6: the check row differs, near ties are decided alone, the steps stay
    the reference's; with the guard off and a 1e-1 nudge some fill departs (the identity checks can fail)."""
    from test_freedave import nudged_batches

    from codila_cli.decoding import freedave

    dlm = resizing_dlm(tiny, torch.float32)
    real = type(dlm).logits_many

    def nudged(scale):
        return nudged_batches(real, scale)

    cases = [random_fill(random.Random(s), 400) for s in range(30)]
    monkeypatch.setattr(type(dlm), "logits_many", nudged(1e-6))
    assert sum(assert_same_fill(dlm, *case)["guarded"] for case in cases) > 0
    monkeypatch.setattr(freedave, "tolerance", lambda dtype: freedave.NO_GUARD)
    monkeypatch.setattr(type(dlm), "logits_many", nudged(1e-1))
    differs = 0
    for prefix, suffix, cfg in cases:
        ref = decode_dreamon(dlm, prefix_ids=prefix, suffix_ids=suffix, config=cfg)
        differs += ref.middle != fill_exact(dlm, prefix_ids=prefix, suffix_ids=suffix, config=cfg).middle
    assert differs > 0


def test_settings_that_draw_or_write_with_the_helper_are_refused():
    with pytest.raises(ValueError, match="--exact verifies deterministic steps"):
        InfillConfig(exact=True, sampling=SamplingConfig(temperature=0.5))
    with pytest.raises(ValueError, match="--exact runs DreamOn's own steps"):
        InfillConfig(exact=True, tau=0.5)
    assert InfillConfig(exact=True).exact and InfillConfig(exact=False, tau=0.5).tau == 0.5


SOURCE = 'def fib(n):\n    """Return the n-th Fibonacci number."""\n    # codila: fill\n\n\nprint(fib(10))\n'


def _infill(path, *args: str):
    return CliRunner().invoke(app, ["infill", str(path), "--seed", "0", "--temperature", "0", "--dtype", "float32",
                                    "--initial-masks", "8", *args], env={"CODILA_NOTICE": "0"})


def test_infill_exact_fills_the_same_middle_and_reports_it(tmp_path):
    """`codila infill --exact` on the bundled DreamOn model: the same file as without it, --json says the
    sequential forwards, the canvases and what verification did, -v says it in a line; `--exact` with the
    helper's decoder or a temperature is one Error: and Hint: (exit 2), the file untouched."""
    f = tmp_path / "fib.py"
    f.write_text(SOURCE)
    plain, exact = _infill(f, "--json"), _infill(f, "--json", "--exact")
    assert plain.exit_code == 0 and exact.exit_code == 0, exact.stderr
    p, e = json.loads(plain.stdout), json.loads(exact.stdout)
    assert e["text"] == p["text"] and e["middle"] == p["middle"]
    assert p["metrics"]["freedave"] is None and p["metrics"]["dlm_rows"] == p["metrics"]["dlm_forwards"]
    m = e["metrics"]
    assert m["dlm_forwards"] < p["metrics"]["dlm_forwards"] and m["dlm_rows"] > m["dlm_forwards"]
    assert m["freedave"]["forwards"] == m["dlm_forwards"] and m["expansions"] == p["metrics"]["expansions"]
    v = _infill(f, "-v", "--exact")
    assert v.exit_code == 0 and "exact (FreeDave): " in v.stderr and v.stdout == e["text"]
    for bad, says in ((["--temperature", "0.7"], "--exact verifies deterministic steps"),
                      (["--decoder", "codila"], "--exact runs DreamOn's own steps")):
        r = _infill(f, "--in-place", "--exact", *bad)
        assert r.exit_code == 2 and r.stdout == "" and f"Error: {says}" in r.stderr and "Hint:" in r.stderr
    assert f.read_text() == SOURCE


def test_eval_runs_an_exact_infill_setting_beside_its_reference(tmp_path):
    """`--setting dreamon:K=1,n0=8,exact=1` beside `dreamon:K=1,n0=8` on HumanEval-Infilling (the bundled infill
    model): the same middle for every task, in fewer sequential forwards."""
    from test_eval import DATA
    from test_freedave import assert_eval_beside

    if not (DATA / "human-eval-infilling").is_dir():
        pytest.skip(f"needs the benchmark data, not found at {DATA} (../shared/data)")
    assert_eval_beside(tmp_path / "ev", ["-b", "he-infill-single", "--data-dir", str(DATA)], "dreamon:K=1,n0=8",
                       "dreamon:K=1,n0=8,exact=1")
