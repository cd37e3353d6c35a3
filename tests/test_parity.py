"""Parity with the official decoders (issue 27): the golden vectors of ../shared/parity/ (tiny Dream
checkpoints, and the ids that Dream-Coder's copy of Dream's ``diffusion_generate`` and Fast-dLLM's Dream
threshold decoding returned for them; its README says how they were made and what to assert).

codila runs them (tests/parity_cases.py, in a subprocess pinned to the AVX2 kernels the goldens were
made with) with ``exact_steps`` (one forward per official step), early stop off, and Fast-dLLM's
convention for threshold decoding. The one intended difference is the mask ban: a case whose official
output changes under that ban is compared with its mask-banned golden. bf16 cases are counted, not
asserted token for token: codila ranks confidences in fp32 (docs/decoders.md, "Parity")."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from parity_cases import DREAM, DREAMON, DREAMON_DIR, DREAMON_TOPK, ENTROPY, FAST, PARITY, _target

AVX2 = platform.machine() in ("x86_64", "AMD64") and "avx2" in Path("/proc/cpuinfo").read_text(errors="ignore") \
    if Path("/proc/cpuinfo").is_file() else False
pytestmark = pytest.mark.skipif(not AVX2, reason="the goldens are pinned to torch's AVX2 CPU kernels")
needs_shared = pytest.mark.skipif(not (PARITY / "dream_cases.jsonl").is_file(), reason=f"needs the parity goldens, not found at {PARITY} (../shared/parity)")
PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
# parity_cases.gemm_fingerprint() where the goldens reproduce bit for bit (the project's build machines:
# AMD EPYC, AVX2 without AVX-512, torch 2.13.0+cpu, the PINNED variables, one thread)
GOLDEN_GEMM = "d0c7787ed150fbc42157c64ce026f99df86c7ba5e3863af1ed680b0e4a93b3ff"


@pytest.fixture(scope="module")
def results() -> dict:
    r = subprocess.run([sys.executable, str(Path(__file__).parent / "parity_cases.py")], capture_output=True,
                       text=True, env={**os.environ, **PINNED}, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def _other_arithmetic(results: dict) -> str | None:
    """Why this machine's fp32 arithmetic is not the goldens' (None where it is): the fp32 GEMM and
    attention fingerprint differs from the one recorded where every golden hash reproduces. The three
    variables pin torch's and oneDNN's kernels, not MKL's fp32 GEMM, which on some CPUs takes another
    code path (a CI machine did: all 163 fp32 hashes differed, all 20 bf16 ones matched)."""
    if results["_gemm"] == GOLDEN_GEMM:
        return None
    return "this CPU's fp32 GEMM/attention rounds differently from the machine the goldens were made on " \
           f"(fingerprint {results['_gemm'][:12]}…, goldens' {GOLDEN_GEMM[:12]}…)"


@needs_shared
def test_the_first_forward_is_the_official_one_bit_for_bit(results):
    """codila's raw logits of every unpadded case's initial canvas hash as the golden's: the bf16 cases
    everywhere (their kernels are pinned), the fp32 cases where the fp32 arithmetic is the goldens'."""
    want = {c["id"]: c["first_forward_logits_sha256"] for c in DREAM + FAST if c["first_forward_logits_sha256"]}
    bf16 = {c["id"] for c in DREAM + FAST if c["dtype"] == "bfloat16" and c["first_forward_logits_sha256"]}
    assert len(want) > 140 and len(bf16) == 20 and set(results["_sha"]) == set(want)
    assert {k: results["_sha"][k] for k in bf16} == {k: want[k] for k in bf16}
    if (why := _other_arithmetic(results)) is not None:
        pytest.skip(f"fp32 hashes not compared: {why}")
    assert results["_sha"] == want


MAX_EXCUSED = 2  # cases that may break a near-tie the other way on other fp32 arithmetic (1 seen: dream-077)


def _excused(results: dict) -> list[str]:
    """The Dream cases whose ids differ from the golden's and that may be excused: only on other fp32
    arithmetic, only a case whose golden recorded exact ties at the selection boundary
    (``boundary_tie_steps``), and only when codila's own run met a near-tie (a gap of at most
    parity_cases.NEAR_TIE at the top-n boundary) at or before the first step that committed a token
    other than the golden's. Every other case is asserted on every machine."""
    if _other_arithmetic(results) is None:
        return []
    near = results["_near_tie_before_divergence"]
    return [c["id"] for c in DREAM if c["id"] in near and near[c["id"]] and (c.get("boundary_tie_steps") or 0) > 0
            and results[c["id"]][0] != list(_target(c))]


def _ties_may_break_otherwise(case: dict, results: dict) -> None:
    if case["id"] in _excused(results):
        pytest.xfail(f"a near-tie before the first difference: {_other_arithmetic(results)}")


@needs_shared
def test_only_a_few_near_ties_are_excused(results):
    """The excuse above is bounded: a codila that changed what it computes (the top-k layout, top-p at low
    temperature, …) differs on many cases, and fails here even where the arithmetic is another's."""
    excused = _excused(results)
    assert len(excused) <= MAX_EXCUSED, excused


def _fp32(cases: list[dict]) -> list[dict]:
    return [c for c in cases if c["dtype"] == "float32"]


@needs_shared
@pytest.mark.parametrize("case", [c for c in _fp32(DREAM) + ENTROPY if len(c["input_ids"]) == 1],
                         ids=lambda c: f"{c['id']}-{c['group']}")
def test_dream_single_rows_match_the_official_loop(case, results):
    _ties_may_break_otherwise(case, results)
    (ids, forwards), = results[case["id"]]
    want, want_forwards = _target(case)
    assert ids == want
    assert forwards == want_forwards


@needs_shared
@pytest.mark.parametrize("case", [c for c in DREAM if len(c["input_ids"]) > 1], ids=lambda c: c["id"])
def test_dream_padded_batches_match_row_by_row_where_the_official_rows_do(case, results):
    """Greedy confidence-alg batches: each row equals its unpadded single run, as the official rows do
    (rows_equal_unpadded_single_runs); the official sampled/origin batches draw jointly over the rows."""
    if not all(case["rows_equal_unpadded_single_runs"]):
        pytest.skip("the official batch draws its random numbers jointly over the rows")
    for r, want in enumerate(case.get("expected_ids_mask_banned") or case["expected_ids"]):
        ids, _ = results[case["id"]][r]
        assert ids == want[case["attention_mask"][r].count(0):]  # the official row without its left pads


@needs_shared
@pytest.mark.parametrize("case", _fp32(FAST),
                         ids=lambda c: f"{c['id']}-{c['group']}-{c['cache']}")
def test_fast_dllm_threshold_decoding_matches_the_official_loop(case, results):
    _ties_may_break_otherwise(case, results)
    (ids, forwards), = results[case["id"]]
    want, want_forwards = _target(case)
    assert ids == want
    assert forwards == want_forwards


@needs_shared
def test_bf16_cases_mostly_agree(results):
    """bf16: the forward is the official one bit for bit; the ranking runs in fp32, so near-ties of the
    bf16 sampler can break otherwise. Measured: 12 of 14 Dream and 5 of 6 Fast-dLLM cases exact."""
    bf16 = [c for c in DREAM + FAST if c["dtype"] == "bfloat16"]
    exact = sum(results[c["id"]][0][0] == _target(c)[0] for c in bf16)
    assert len(bf16) == 20 and exact >= 17


@needs_shared
@pytest.mark.parametrize("case_id, flags", [
    ("dream-004", ["--decoder", "dream", "--steps", "32", "--alg", "maskgit_plus", "--exact-steps"]),
    ("fastdllm-028", ["--decoder", "threshold", "--threshold-convention", "fast-dllm", "--block-length", "8"]),
    ("fastdllm-027", ["--decoder", "threshold", "--threshold-convention", "fast-dllm", "--block-length", "8"]),
])
def test_the_command_line_reproduces_chat_prompt_cases(case_id, flags):
    """`codila gen` (chat template, --no-early-stop, fp32) decodes a golden case's prompt to the golden's
    text, with the official forward count; --exact-steps and --threshold-convention reach the decoders."""
    from parity_cases import _dlm

    case = next(c for c in DREAM + FAST if c["id"] == case_id)
    s = case["settings"]
    cache = ["--cache", case["cache"]] if case.get("cache", "none") != "none" else []
    args = [sys.executable, "-m", "codila_cli", "gen", "--dlm", str(PARITY / "checkpoints" / case["checkpoint"]),
            "--dtype", "float32", "--no-early-stop", "--json", "--max-new-tokens", str(s["max_new_tokens"]),
            *(["--threshold", str(s.get("threshold", 0.9))] if "threshold" in flags else []), *flags, *cache,
            case["prompt"]["text"]]
    r = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **PINNED}, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    want, forwards = _target(case)
    dlm = _dlm(case["checkpoint"], "float32")
    gen = want[len(case["input_ids"][0]):]
    stop = next((i for i, t in enumerate(gen) if t in dlm.specials.stop_ids), len(gen))
    assert doc["metrics"]["prompt_tokens"] == len(case["input_ids"][0])
    assert doc["completion"] == dlm.tokenizer.decode(gen[:stop], skip_special_tokens=True)
    assert doc["metrics"]["dlm_forwards"] == forwards


def _dreamon_target(case: dict) -> tuple[list[int], int]:
    """The official middle (mask-banned variant where the ban changes it), without the special ids that
    the official loop's final decode drops anyway: masks left at the step cap, expand and end-of-text."""
    ids = case["expected_middle_ids_mask_banned"] if case["mask_ban_changes_output"] else case["expected_middle_ids"]
    forwards = case["forwards_mask_banned"] if case["mask_ban_changes_output"] else case["forwards"]
    return [t for t in ids if t not in (512, 516, 517)], forwards  # the fixtures' eos, mask, expand (README)


@pytest.mark.parametrize("case", DREAMON + DREAMON_TOPK,
                         ids=lambda c: f"{c['id']}-{c['checkpoint'][-1]}-{c['settings']['alg']}-{c['dtype']}")
def test_dreamon_infilling_matches_the_official_loop(case, results):
    """DreamOn's eval/generator.py (expand/delete, pad-eos-to-right, delete_eos_token) vs decode_dreamon:
    the same middle ids and the same forward count, fp32 and bf16 (tests/fixtures/dreamon/README.md)."""
    (middle, forwards), = results[case["id"]]
    want, want_forwards = _dreamon_target(case)
    assert middle == want
    assert forwards == want_forwards


@needs_shared
def test_the_session_23_entropy_goldens_exercise_what_they_claim():
    """The entropy cases are at low temperature without top-p, where near-certain slots are many."""
    assert len(ENTROPY) == 24 and all(c["settings"]["top_p"] is None and 0 < c["settings"]["temperature"] <= 0.2
                                      and c["settings"]["alg"] == "entropy" for c in ENTROPY)


def test_the_session_23_goldens_exercise_what_they_claim():
    """The DreamOn top-k cases (committed fixtures) filter with top-k (5 and 20), greedy and sampled."""
    assert {c["settings"]["top_k"] for c in DREAMON_TOPK} == {5, 20} and len(DREAMON_TOPK) == 18
    assert {c["settings"]["temperature"] > 0 for c in DREAMON_TOPK} == {True, False}


def test_dreamon_goldens_exercise_what_they_claim():
    """The cases cover expansion, deletion, the step cap, bos commits and the mask ban (a checkpoint
    whose official run commits the mask and spins until the cap), so the test above is not vacuous."""
    grew = [c for c in DREAMON if len(c["expected_middle_ids"]) > c["settings"]["min_gen_len"]]
    shrank = [c for c in DREAMON if len(c["expected_middle_ids"]) < c["settings"]["min_gen_len"]]
    assert len(grew) >= 10 and len(shrank) >= 3
    assert sum(c["official_emits_bos"] for c in DREAMON) >= 3
    banned = [c for c in DREAMON if c["mask_ban_changes_output"]]
    assert len(banned) >= 5 and all(c["forwards"] == c["settings"]["steps"] for c in banned)
    assert {c["dtype"] for c in DREAMON} == {"float32", "bfloat16"}


def test_codila_infill_on_the_command_line_reproduces_a_golden_middle(tmp_path):
    """`codila infill` with the official settings (--initial-masks = min_gen_len, --max-middle-tokens =
    max_gen_len, --steps) writes the official middle's text between the golden's prefix and suffix."""
    from parity_cases import _dreamon_dlm

    case = next(c for c in DREAMON if c["id"] == "dreamon-001")  # greedy entropy, 15-token middle
    s = case["settings"]
    dlm = _dreamon_dlm(case["checkpoint"], case["dtype"])
    src = tmp_path / "f.py"
    src.write_text(case["prefix"] + "# codila: fill\n" + case["suffix"])
    args = [sys.executable, "-m", "codila_cli", "infill", str(src), "--dlm", str(DREAMON_DIR / "checkpoints" / case["checkpoint"]),
            "--dtype", "float32", "--json", "--initial-masks", str(s["min_gen_len"]), "--max-middle-tokens",
            str(s["max_gen_len"]), "--steps", str(s["steps"])]  # entropy: the default alg
    r = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **PINNED}, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    want, forwards = _dreamon_target(case)
    assert doc["metrics"]["dlm_forwards"] == forwards
    # the fill replaces the marker's whole line, so codila ends it with the line's newline
    assert doc["middle"] == dlm.tokenizer.decode(want, skip_special_tokens=True) + "\n"


def test_the_cached_entropy_mode_is_reachable_and_checked(tiny):
    """`--entropy-steps` / eval key `esteps`: Fast-dLLM's cached entropy mode (group block_entropy above);
    without the fast-dllm convention and a cache, or with steps that do not divide into the blocks, it
    is a usage error (exit 2), not a silent fallback."""
    from typer.testing import CliRunner

    from codila_cli.cli import app
    from codila_cli.eval.settings import parse_setting

    cfg = parse_setting("threshold:0.9,conv=fast-dllm,cache=prefix,block=8,esteps=8", max_new_tokens=32).config
    assert cfg.entropy_steps == 8 and cfg.cache == "prefix"
    base = ["gen", "--dlm", str(tiny["dlm"]), "--decoder", "threshold", "--max-new-tokens", "16", "--block-length", "8",
            "--seed", "0", "--json", "--no-early-stop", "t1 t2"]
    ok = CliRunner().invoke(app, [*base, "--threshold-convention", "fast-dllm", "--cache", "dual", "--entropy-steps", "4"])
    assert ok.exit_code == 0, ok.stderr
    assert json.loads(ok.stdout)["metrics"]["dlm_forwards"] == 4  # 2 blocks × (1 full + 1 cached)
    for bad in (["--entropy-steps", "4"], ["--threshold-convention", "fast-dllm", "--entropy-steps", "4"],
                ["--threshold-convention", "fast-dllm", "--cache", "prefix", "--entropy-steps", "3"]):
        r = CliRunner().invoke(app, [*base, *bad])
        assert r.exit_code == 2 and "Error:" in r.stderr, r.stderr
