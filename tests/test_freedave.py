"""--exact (decoding/freedave.py, FreeDave arXiv 2510.00294): the one-token-per-step decode's tokens, step for step,
in fewer sequential forwards, for every family: on the golden cases that run deterministically, on seeded
random cases of tiny models (each committed step compared with the reference's), batched and alone, fp32 and
bf16; and what is refused."""

from __future__ import annotations

import importlib
import json
import random
import re
import subprocess
import sys

import pytest
import torch
from golden_cases import fixture_dlm

from codila_cli.decoding.block import BlockConfig
from codila_cli.decoding.config import DreamConfig, SamplingConfig, exact_problem
from codila_cli.decoding.events import no_op
from codila_cli.decoding.freedave import decode_exact
from codila_cli.decoding.llada import LladaConfig
from codila_cli.decoding.metrics import MetricsRecorder

SAMPLERS = {"dream": ("dream", "decode_dream"), "llada": ("llada", "decode_llada"), "block": ("block", "decode_block")}


def _reference(decoder: str):
    module, name = SAMPLERS[decoder]
    return getattr(importlib.import_module(f"codila_cli.decoding.{module}"), name)


def _both(dlm, ids, decoder: str, config) -> tuple:
    """(reference result, its events, exact result, its events)."""
    ref_events, ex_events = MetricsRecorder(), MetricsRecorder()
    ref = _reference(decoder)(dlm, ids, config=config, on_step=ref_events)
    ex = decode_exact(dlm, ids, decoder=decoder, config=config, on_step=ex_events)
    return ref, ref_events.events, ex, ex_events.events


def _steps(events) -> list[tuple]:
    """Each committed step as the reference takes it: (positions as a set, tokens by position, source)."""
    return [(tuple(sorted(zip(e.positions, e.tokens))), e.source) for e in events]


def assert_same_decode(dlm, ids, decoder, config) -> dict:
    """The exact decode commits the reference's steps in its order (a step the reference would not take
    fails here, whatever the final text), in no more sequential forwards; returns its counts."""
    ref, ref_events, ex, ex_events = _both(dlm, ids, decoder, config)
    assert _steps(ex_events) == _steps(ref_events), (decoder, config)
    assert ex.canvas == ref.canvas and ex.stopped_early == ref.stopped_early
    # a round commits at least one step for one forward, plus one lone forward when a near tie was read from a
    # batch (guarded), so the count never passes the reference's by more than the ties
    assert ex.dlm_forwards <= ref.dlm_forwards + ex.freedave["guarded"] + 1
    assert ex.freedave["forwards"] <= ex.dlm_forwards and ex.dlm_rows >= ex.dlm_forwards
    return {"ref": ref.dlm_forwards, "exact": ex.dlm_forwards, **ex.freedave}


# --- the golden cases that run at one deterministic step at a time (every family) ---------------------------

def _golden_modules():
    from shared_data import PARITY

    # SDAR's goldens are all sampled (its official sampler divides by a temperature of 0), so none runs here;
    # SDAR's network and block rules are held to the reference on random cases below
    out = [("llada_cases", "run", "llada"), ("stable_diffcoder_cases", "run", "block")]
    if PARITY.is_dir():
        out.append(("parity_cases", "run_dream", "dream"))
    return out


def _deterministic(case: dict) -> bool:
    s = case["settings"]
    if (s.get("temperature") or 0) > 0 or s.get("alg_temp") or s.get("alg") == "origin" or s.get("cfg_scale"):
        return False
    return s.get("remasking", s.get("remasking_strategy", "")) not in ("random",)


@pytest.mark.parametrize("module,function,decoder", _golden_modules(), ids=lambda v: str(v))
def test_exact_gives_the_reference_ids_on_every_deterministic_golden_case(module, function, decoder, monkeypatch):
    """Each golden case with deterministic settings, run by its own harness with the sampler swapped for
    FreeDave: the same ids as the harness's reference run (which tests/test_{llada,sdar,…}.py hold to the
    official code), in fewer or as many sequential forwards."""
    mod = importlib.import_module(module)
    cases = [c for c in getattr(mod, "CASES", getattr(mod, "DREAM", [])) if _deterministic(c)]
    assert len(cases) >= 3, "the goldens hold deterministic cases of this family"
    sampler_mod = importlib.import_module(f"codila_cli.decoding.{SAMPLERS[decoder][0]}")
    real = getattr(sampler_mod, SAMPLERS[decoder][1])
    run = getattr(mod, function)
    saved = 0
    for case in cases:
        want_ids, want_forwards = run(case)
        guarded: list[int] = []

        def exact(dlm, ids, *, config, generator=None, on_step=no_op, guarded=guarded):
            monkeypatch.setattr(sampler_mod, SAMPLERS[decoder][1], real)  # decode_exact calls the block loop
            try:
                res = decode_exact(dlm, ids, decoder=decoder, config=config, generator=generator, on_step=on_step)
                guarded.append(res.freedave["guarded"])
                return res
            finally:
                monkeypatch.setattr(sampler_mod, SAMPLERS[decoder][1], exact)

        monkeypatch.setattr(sampler_mod, SAMPLERS[decoder][1], exact)
        try:
            got_ids, got_forwards = run(case)
        finally:
            monkeypatch.setattr(sampler_mod, SAMPLERS[decoder][1], real)
        assert got_ids == want_ids, case["id"]
        assert got_forwards <= want_forwards + sum(guarded), case["id"]  # a near tie read from a batch: one more
        saved += want_forwards - got_forwards
    assert saved > 0  # it saves forwards somewhere


# --- seeded random cases ---------------------------------------------------------------------------------------

def _random_config(decoder: str, rng: random.Random, dtype_cap: int = 40):
    L = rng.choice([8, 12, 16, 24, 32, dtype_cap])
    sampling = SamplingConfig(top_k=rng.choice([None, None, 5]), top_p=rng.choice([None, None, 0.9]))
    early = rng.random() < 0.5
    if decoder == "dream":
        sched = rng.choice(["K", "steps", "none"])
        return DreamConfig(max_new_tokens=L, alg=rng.choice(["entropy", "maskgit_plus", "topk_margin"]),
                           tokens_per_step=rng.choice([1, 1, 2]) if sched == "K" else None,
                           steps=rng.choice([L, L // 2, max(1, L // 3)]) if sched == "steps" else None,
                           sampling=sampling, early_stop=early)
    if decoder == "llada":
        block = rng.choice([b for b in (4, 8, L) if L % b == 0])
        blocks = L // block
        return LladaConfig(max_new_tokens=L, block_length=block, steps=rng.choice([L, max(blocks, L // 2 // blocks * blocks)]),
                           remasking=rng.choice(["low_confidence", "low_confidence", "sequential"]),
                           sampling=sampling, early_stop=early)
    return BlockConfig(max_new_tokens=L, block_length=rng.choice([2, 4, 8]), steps=rng.choice([None, None, 2]),
                       remasking=rng.choice(["low_confidence", "low_confidence", "dynamic", "sequential"]),
                       threshold=rng.choice([0.05, 0.2, 0.5]), sampling=sampling, early_stop=early)


FAMILIES = {"dream": None, "llada": ("llada", "llada-tiny-a"), "sdar": ("sdar", "sdar-tiny-a"),
            "stable-diffcoder": ("stable_diffcoder", "sdc-tiny-b")}


def _property(family: str, n: int, dtype: str, tiny: dict, seed0: int = 0) -> dict:
    from codila_cli.models.families import load_dlm

    if family == "dream":
        dlm = load_dlm(tiny["dlm"], name="tiny-dream", device=torch.device("cpu"), dtype=getattr(torch, dtype))
        decoder = "dream"
    else:
        dlm = fixture_dlm(*FAMILIES[family], dtype)
        decoder = "llada" if family == "llada" else "block"
    vocab = min(dlm.vocab_rows, 400)
    totals = {"ref": 0, "exact": 0, "guarded": 0, "cases": 0}
    for seed in range(seed0, seed0 + n):
        rng = random.Random(seed)
        ids = [rng.randrange(5, vocab) for _ in range(rng.randrange(1, 14))]
        ids = [t for t in ids if t not in (dlm.specials.mask, *dlm.specials.stop_ids)] or [7]
        out = assert_same_decode(dlm, ids, decoder, _random_config(decoder, rng))
        for k in ("ref", "exact", "guarded"):
            totals[k] += out[k]
        totals["cases"] += 1
    return totals


@pytest.mark.parametrize("family", list(FAMILIES))
def test_random_cases_commit_the_reference_steps_in_fp32(family, tiny):
    """120 seeded random settings and prompts per family (the slow suite runs 1,750 more): every committed
    step is the reference's, and in all the exact decode needs fewer sequential forwards."""
    totals = _property(family, 120, "float32", tiny)
    assert totals["cases"] == 120 and totals["exact"] < totals["ref"]


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_thousands_of_random_cases(family, tiny):
    totals = _property(family, 1500, "float32", tiny, seed0=10_000)
    assert totals["exact"] < totals["ref"]
    totals = _property(family, 250, "bfloat16", tiny, seed0=20_000)
    assert totals["exact"] <= totals["ref"] + totals["guarded"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_random_cases_in_bf16(family, tiny):
    """bf16: a batched row may round a logit otherwise than the lone forward; a decision read from a batch
    counts only when its leads clear the bf16 tolerance, else the canvas is forwarded alone (guarded).
    On these cases every step is the reference's (docs/decoders.md, Exact, says what is promised)."""
    totals = _property(family, 40, "bfloat16", tiny, seed0=5_000)
    assert totals["cases"] == 40


def nudged_batches(real, scale: float):
    """``real`` (a denoiser's ``logits_many``) with each batched (d > 1) forward's rows moved by ``scale`` × a
    seeded normal draw: a batch that rounds otherwise than lone forwards, as a 16-bit one does."""
    def logits_many(self, xs, spans):
        out = real(self, xs, spans)
        if xs.shape[0] > 1:
            g = torch.Generator().manual_seed(int(xs.sum()))
            out = [o + scale * torch.randn(o.shape, generator=g) for o in out]
        return out
    return logits_many


def test_a_batched_forward_that_rounds_otherwise_is_caught_at_near_ties(tiny, monkeypatch):
    """The guard is what keeps a batched forward's rounding from choosing: batched rows (d > 1) nudged by
    1e-6 fail the batch's check row (the last lone canvas again, compared bit for bit), so decisions read from
    them must clear the tolerance, and near ties are decided from the canvas's own forward: the reference's
    steps. With the guard off and the nudge at 1e-1 the text departs from the reference: the identity checks
    can fail."""
    from codila_cli.decoding import freedave
    from codila_cli.models.families import load_dlm

    dlm = load_dlm(tiny["dlm"], name="tiny-dream", device=torch.device("cpu"), dtype=torch.float32)
    real = type(dlm).logits_many

    def nudged(scale):
        return nudged_batches(real, scale)

    cfg = DreamConfig(max_new_tokens=24, tokens_per_step=1, early_stop=False)
    prompts = [[5 + i, 9, 30 + i] for i in range(12)]
    monkeypatch.setattr(type(dlm), "logits_many", nudged(1e-6))
    guarded = sum(assert_same_decode(dlm, p, "dream", cfg)["guarded"] for p in prompts)
    monkeypatch.setattr(freedave, "tolerance", lambda dtype: freedave.NO_GUARD)
    monkeypatch.setattr(type(dlm), "logits_many", nudged(1e-1))
    differs = 0
    for p in prompts:
        ref, _, ex, _ = _both(dlm, p, "dream", cfg)
        differs += ref.canvas != ex.canvas
    assert differs > 0
    assert guarded > 0  # the nudged batches were caught (their check row differed) and near ties went alone


def test_batches_that_keep_ending_in_near_ties_cost_about_the_reference_forwards(tiny, monkeypatch):
    """A batch whose next decision is a near tie bought nothing and cost a forward (the canvas then goes
    alone). Where that keeps happening (16 bits, a flat model), the driver backs off: it drafts nothing for
    1, 3, 7, … rounds, so it costs about the reference's sequential forwards, not twice them (every batch
    here is made a near tie: nudged, and a tolerance no lead clears)."""
    from codila_cli.decoding import freedave
    from codila_cli.models.families import load_dlm

    dlm = load_dlm(tiny["dlm"], name="tiny-dream", device=torch.device("cpu"), dtype=torch.float32)
    monkeypatch.setattr(type(dlm), "logits_many", nudged_batches(type(dlm).logits_many, 1e-6))
    monkeypatch.setattr(freedave, "tolerance", lambda dtype: 1e9)
    cfg = DreamConfig(max_new_tokens=48, tokens_per_step=1, early_stop=False)
    ref_forwards = exact_forwards = guarded = 0
    for p in ([5 + i, 9, 30 + i] for i in range(4)):
        ref, _, ex, _ = _both(dlm, p, "dream", cfg)
        assert ex.canvas == ref.canvas
        ref_forwards, exact_forwards = ref_forwards + ref.dlm_forwards, exact_forwards + ex.dlm_forwards
        guarded += ex.freedave["guarded"]
    assert guarded > 0 and exact_forwards <= 1.2 * ref_forwards, (exact_forwards, ref_forwards, guarded)


# --- batched, and through the commands --------------------------------------------------------------------------

def test_rows_decoded_exactly_in_a_shared_batch_are_their_lone_reference_decodes(tiny_models):
    """A server's rows: each FreeDave row runs its verification as its own forward inside the shared batch
    (decoding/batch.py); texts equal each prompt's lone one-token-per-step decode."""
    from dataclasses import replace

    from codila_cli.engine.generate import generate, generate_many

    cfg = DreamConfig(max_new_tokens=16, tokens_per_step=1)
    prompts = ["def f(x):", "def g(a, b):\n", "class A:\n", "import os\n"]
    alone = [generate(tiny_models, p, decoder="dream", config=cfg, seed=0).completion for p in prompts]
    out = generate_many(tiny_models, prompts, decoder="dream", config=replace(cfg, exact=True), seeds=[0] * 4,
                        batched=True)
    assert out.batched and [r.completion for r in out.results] == alone
    assert all(r.metrics["freedave"] is not None and r.metrics["dlm_rows"] >= r.metrics["dlm_forwards"]
               for r in out.results)


def _gen(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "codila_cli", "gen", "--dlm", "bundled-dlm", *args],
                          capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "CODILA_NOTICE": "0"})


def test_gen_exact_json_and_verbose_report_forwards_and_refusals():
    """`gen --exact`: the same text as without it, --json says the sequential forwards, the canvases they
    evaluated and what verification did, -v says it in a line; in bf16 a warning says the text may differ at
    near ties; random settings are one Error: and a Hint: before any model loads (exit 2); a CPU leaves it
    off unless asked."""
    base = ["--decoder", "dream", "--max-new-tokens", "24", "-K", "1", "--seed", "3", "--dtype", "float32", "--json",
            "def add(a, b):"]
    plain, exact = _gen(*base), _gen("--exact", *base)
    assert plain.returncode == 0 and exact.returncode == 0, exact.stderr
    assert "Warning" not in exact.stderr
    half = _gen("--exact", *base[:-4], "--dtype", "bfloat16", base[-1])
    assert half.returncode == 0 and "Warning: --exact in bfloat16" in half.stderr and "--dtype float32" in half.stderr
    p, e = json.loads(plain.stdout), json.loads(exact.stdout)
    assert e["text"] == p["text"] and e["settings"]["exact"] is True and p["settings"]["exact"] is None
    assert p["metrics"]["freedave"] is None and p["metrics"]["dlm_rows"] == p["metrics"]["dlm_forwards"] == 24
    m = e["metrics"]
    assert m["dlm_forwards"] < 24 and m["dlm_rows"] > m["dlm_forwards"] and m["freedave"]["rows"] <= m["dlm_rows"]
    assert m["tokens_per_step"] == pytest.approx(m["tokens"] / m["dlm_forwards"])
    v = _gen("--exact", "-v", *base[:-2], base[-1])
    assert "exact (FreeDave): " in v.stderr and "sequential forwards" in v.stderr and v.stdout.startswith("def add")
    bad = _gen("--exact", "--temperature", "0.7", *base)
    assert bad.returncode == 2 and bad.stdout == ""
    assert "Error: --exact verifies deterministic steps" in bad.stderr and "Hint:" in bad.stderr
    codila = _gen("--exact", "--max-new-tokens", "8", "def f(")
    assert codila.returncode == 2 and "--exact is a setting of the dream, llada and block decoders" in codila.stderr
    other = _gen("--exact", "--decoder", "llada", "--dtype", "bfloat16", "--max-new-tokens", "8", "def f(")
    assert other.returncode == 2 and "--decoder llada does not run it" in other.stderr  # its error, and no 16-bit
    assert "Warning" not in other.stderr  # warning about a decode that never runs


def test_exact_is_refused_for_settings_that_draw():
    for cfg in (DreamConfig(sampling=SamplingConfig(temperature=0.5)), DreamConfig(alg="origin"),
                DreamConfig(alg_temp=0.3), LladaConfig(remasking="random"), LladaConfig(cfg_scale=1.0),
                BlockConfig(sampling=SamplingConfig(temperature=1.0))):
        assert exact_problem(cfg) is not None
        with pytest.raises(ValueError, match="--exact verifies deterministic steps"):
            type(cfg)(**{**cfg.__dict__, "exact": True})
    assert exact_problem(BlockConfig(remasking="dynamic")) is None and exact_problem(LladaConfig()) is None


def test_auto_runs_it_only_where_spare_rows_are_free(tiny_models):
    """Unset, --exact follows the measurement: off on a CPU (a verification forward of d canvases costs d
    forwards there: benchmarks/exact.py) and in 16 bits, on with CUDA in fp32 for deterministic settings."""
    from types import SimpleNamespace

    from codila_cli.engine.generate import exact_pays

    dlm = tiny_models.dlm
    assert not exact_pays(dlm, "dream", DreamConfig())
    cuda = SimpleNamespace(device=torch.device("cuda"), family=dlm.family, ckpt=SimpleNamespace(dtype=torch.float32))
    assert exact_pays(cuda, "dream", DreamConfig()) and exact_pays(cuda, "block", BlockConfig())
    bf16 = SimpleNamespace(device=torch.device("cuda"), family=dlm.family, ckpt=SimpleNamespace(dtype=torch.bfloat16))
    assert not exact_pays(bf16, "dream", DreamConfig()) and exact_pays(bf16, "dream", DreamConfig(exact=True))
    assert not exact_pays(cuda, "dream", DreamConfig(sampling=SamplingConfig(temperature=0.2)))
    assert not exact_pays(cuda, "dream", DreamConfig(exact=False)) and not exact_pays(cuda, "codila", DreamConfig())


def test_the_server_runs_exact_requests_and_fills_beside_others_and_counts_them():
    """`"codila": {"exact": true}` on a completion and on a fill (OpenAI's suffix: DreamOn): the same text as the
    request without it, decoded in a shared batch beside other requests, the choice says so, /metrics counts
    the sequential forwards and canvases of both; with a temperature it is a 400 naming the setting."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    from test_serve import Server

    s = Server("--max-batch", "4")
    try:
        def ask(body: dict) -> dict:
            r = httpx.post(s.url + "/v1/completions", json={"model": "codila", "temperature": 0, "seed": 1, **body},
                           timeout=120)
            assert r.status_code == 200, r.text
            return r.json()

        gens = [{"prompt": p, "max_tokens": 16, "codila": {"decoder": "dream", "tokens_per_step": 1}}
                for p in ("def fib(n):", "class Stack:\n", "def gcd(a, b):")]
        fills = [{"prompt": p, "suffix": "\n\nprint('done')\n", "max_tokens": 24, "codila": {"initial_masks": 8}}
                 for p in ("def fib(n):\n", "def gcd(a, b):\n", "class Stack:\n    def push(self, x):\n")]
        bodies = gens + fills
        with ThreadPoolExecutor(6) as pool:
            exact = list(pool.map(ask, [{**b, "codila": {**b["codila"], "exact": True}} for b in bodies]))
            plain = list(pool.map(ask, bodies))
        infos = [(e["codila"]["choices"][0], p["codila"]["choices"][0]) for e, p in zip(exact, plain)]
        for e, p, (info, base) in zip(exact, plain, infos):
            assert e["choices"][0]["text"] == p["choices"][0]["text"]
            assert info["exact_decode"] and not base["exact_decode"] and info["decoder"] == base["decoder"]
            assert info["dlm_forwards"] <= base["dlm_forwards"] and info["dlm_rows"] >= info["dlm_forwards"]
        assert [info["decoder"] for info, _ in infos] == ["dream"] * 3 + ["dreamon"] * 3
        for part in (infos[:3], infos[3:]):  # generations and fills each take fewer sequential forwards
            assert sum(i["dlm_forwards"] for i, _ in part) < sum(b["dlm_forwards"] for _, b in part)
        metrics = httpx.get(s.url + "/metrics").text
        on = float(re.search(r'codila_sequential_dlm_forwards_total\{freedave="on"\} (\S+)', metrics).group(1))
        assert on == sum(info["dlm_forwards"] for info, _ in infos)
        assert re.search(r'codila_dlm_canvases_total\{freedave="off"\} (\S+)', metrics)
        for body in ({"prompt": "x", "codila": {"decoder": "dream", "exact": True}},
                     {"prompt": "x", "suffix": "y", "codila": {"exact": True}}):
            bad = httpx.post(s.url + "/v1/completions", json={"model": "codila", "max_tokens": 4, "temperature": 0.7,
                                                              **body})
            assert bad.status_code == 400 and "verifies deterministic steps" in bad.text
    finally:
        s.stop()


def assert_eval_beside(out, args: list[str], plain: str, exact: str) -> None:
    """`codila eval ARGS --setting PLAIN --setting EXACT` on 3 tasks: the same completion for every task, in no
    more sequential forwards each and fewer in all (rows.jsonl's dlm_forwards are the sequential ones)."""
    from test_eval import EVAL
    from typer.testing import CliRunner

    from codila_cli.cli import app

    r = CliRunner().invoke(app, [*EVAL, *args, "--limit", "3", "--setting", plain, "--setting", exact, "--max-new-tokens",
                                 "16", "-o", str(out), "--timeout", "3"])
    assert r.exit_code == 0, r.stderr
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    by = {(row["setting"], row["task_id"]): row for row in rows}
    tasks = {row["task_id"] for row in rows}
    assert len(tasks) == 3
    for t in tasks:
        assert by[exact, t]["completion"] == by[plain, t]["completion"]
        assert by[exact, t]["dlm_forwards"] <= by[plain, t]["dlm_forwards"]
    assert sum(by[exact, t]["dlm_forwards"] for t in tasks) < sum(by[plain, t]["dlm_forwards"] for t in tasks)


def test_eval_runs_an_exact_setting_beside_its_reference(tiny, tmp_path):
    """`codila eval --setting dream:K=1,exact=1` beside `dream:K=1`: the same completion for every task, in
    fewer DLM forwards."""
    assert_eval_beside(tmp_path / "ev", ["-b", "humaneval", "--dlm", str(tiny["dlm"])], "dream:K=1", "dream:K=1,exact=1")


def test_a_decision_read_from_a_batch_is_robust_only_if_the_filters_keep_their_tokens():
    """With top-p or top-k, which tokens survive the filter decides every slot's confidence: a row whose
    cumulative probability lies within the tolerance of top-p, or whose k-th logit leads the next by less, could
    rank otherwise in a lone forward, so a decision read from a batch with such a row is not robust (its
    canvas is then forwarded alone); from the reference's own arithmetic (tolerance −inf) it stands."""
    import math

    from codila_cli.decoding.dream import DreamRule
    from codila_cli.decoding.freedave_rules import View
    from codila_cli.decoding.marginals import filter_lead

    def row(probs: list[float], vocab: int = 8) -> torch.Tensor:
        z = torch.full((vocab,), -30.0)
        z[: len(probs)] = torch.tensor(probs).log()
        return z

    near_p = row([0.5, 0.4000001, 0.0999999])  # cumulative 0.9000001: a hair over top-p 0.9
    far = row([0.95, 0.03, 0.02])
    assert filter_lead(torch.stack([far]), SamplingConfig()) == math.inf
    assert filter_lead(torch.stack([near_p]), SamplingConfig(top_p=0.9)) < 1e-5
    assert filter_lead(torch.stack([far]), SamplingConfig(top_p=0.9)) > 1e-2
    tied_k = row([0.6, 0.2, 0.2])  # the 2nd and 3rd logits tie at top-k 2's boundary
    assert filter_lead(torch.stack([tied_k]), SamplingConfig(top_k=2)) < 1e-5
    x = torch.tensor([7, 1, 1])  # a prompt token and two masked slots (mask id 1)
    for sampling, near in ((SamplingConfig(top_p=0.9), near_p), (SamplingConfig(top_k=2), tied_k)):
        rule = DreamRule(DreamConfig(max_new_tokens=2, tokens_per_step=1, sampling=sampling), 1, 1)
        for rows, robust in (([far, near], False), ([far, row([0.6, 0.39, 0.01])], True)):
            view = View(1, 3, torch.stack(rows))
            assert rule.decide(x, view, 0, 1e-5).robust is robust, (sampling, robust)
            assert rule.decide(x, view, 0, float("-inf")).robust
