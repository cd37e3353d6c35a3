"""Issue 26: the bundled models say what they are, the wider corpus reads a `pip install --target`
directory, and the external prompt sets (dev-ext, heldout-ext) and the everyday prompts are sound."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codila_cli.cli import app
from codila_cli.models.registry import bundled_available

NOTE = "demo model"


def _models(*names):
    from codila_cli.engine.models import Models

    return Models(dlm=None, bundled=tuple(names))


def test_bundled_notice_says_what_runs_and_how_to_silence_it(tmp_path, monkeypatch):
    """One line under 130 characters naming each command's real model and the variable that hides it;
    -q, CODILA_NOTICE=0 and `config set notices.bundled false` silence it."""
    from codila_cli.config import load_config, set_value
    from codila_cli.report import bundled_notice

    user = load_config(tmp_path / "none.toml")
    line = bundled_notice(_models("bundled-dlm", "bundled-ar"), user, quiet=False)
    assert line.startswith("Note: bundled-dlm + bundled-ar are demo models; for real use:")
    assert "--dlm dream-coder + codila train align" in line and "CODILA_NOTICE=0" in line and "\n" not in line
    assert "qwen3-0.6b" not in line  # an unaligned helper is not a recommendation (issue 50)
    for command, real in (("infill", "--dlm dreamon"), ("plan", "--dlm dream-coder (")):
        one = bundled_notice(_models("bundled-infill"), user, quiet=False, command=command)
        assert real in one and len(one) < 120, one
    assert len(line) < 130
    monkeypatch.setenv("CODILA_NOTICE", "0")
    assert bundled_notice(_models("bundled-dlm"), user, quiet=False) is None
    monkeypatch.delenv("CODILA_NOTICE")
    set_value("notices.bundled", "false", path=tmp_path / "set.toml")
    assert bundled_notice(_models("bundled-dlm"), load_config(tmp_path / "set.toml"), quiet=False) is None
    assert bundled_notice(_models(), user, quiet=False) is None  # a real model: nothing to say
    assert bundled_notice(_models("bundled-dlm"), user, quiet=True) is None
    cfg = tmp_path / "c.toml"
    cfg.write_text("[notices]\nbundled = false\n")
    assert bundled_notice(_models("bundled-dlm"), load_config(cfg), quiet=False) is None
    cfg.write_text("[notices]\nbundled = true\n")
    assert bundled_notice(_models("bundled-dlm"), load_config(cfg), quiet=False) is not None


def test_notices_bundled_must_be_a_boolean(tmp_path):
    from codila_cli.config import load_config
    from codila_cli.errors import UsageError

    cfg = tmp_path / "c.toml"
    cfg.write_text('[notices]\nbundled = "no"\n')
    with pytest.raises(UsageError, match="notices.bundled must be bool"):
        load_config(cfg)
    cfg.write_text("[gen]\nmax_new_tokens = true\n")  # booleans are still refused where a number is due
    with pytest.raises(UsageError, match="gen.max_new_tokens must be int"):
        load_config(cfg)


def test_tiny_models_are_not_bundled(tiny_models):
    assert tiny_models.bundled == ()


@pytest.mark.skipif(not bundled_available("bundled-dlm"), reason="bundled weights not installed")
def test_gen_on_the_bundled_pair_says_so_once_on_stderr_only(monkeypatch, tmp_path):
    args = ["gen", "--seed", "0", "--max-new-tokens", "8", "def fib(n):"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.stderr
    assert r.stderr.count(NOTE) == 1 and NOTE not in r.stdout
    assert r.stdout.startswith("def fib(n):")
    quiet = CliRunner().invoke(app, [*args, "-q"])
    assert NOTE not in quiet.stderr and quiet.stdout == r.stdout
    cfg = tmp_path / "codila-config.toml"  # the file the autouse fixture points CODILA_CONFIG at
    cfg.write_text("[notices]\nbundled = false\n")
    silenced = CliRunner().invoke(app, args)
    assert silenced.exit_code == 0 and NOTE not in silenced.stderr and silenced.stdout == r.stdout


def test_models_marks_bundled_models_as_demonstrations():
    r = CliRunner().invoke(app, ["models", "--json"])
    rows = json.loads(r.stdout)["models"]
    assert {row["alias"] for row in rows if row["demonstration"]} == {
        "bundled-dlm", "bundled-ar", "bundled-infill", "bundled-plan"}
    text = CliRunner().invoke(app, ["models"]).stdout
    assert "demonstration" in text and "not a code assistant" in text


def _site(tmp_path: Path) -> Path:
    """A `pip install --target` layout: a package, a single-file module, and a non-permissive one."""
    site = tmp_path / "site"
    (site / "pkga").mkdir(parents=True)
    (site / "pkga" / "__init__.py").write_text('def double(x):\n    """Twice x."""\n    y = x * 2\n    return y\n')
    (site / "pkga" / "test_skip.py").write_text("def test_x():\n    assert True\n")
    (site / "onefile.py").write_text('def triple(x):\n    """Three times x."""\n    y = x * 3\n    return y\n')
    (site / "closed.py").write_text("def secret():\n    return 1\n")
    for name, lic in (("pkga", "MIT"), ("onefile", "BSD-3-Clause"), ("closed", "Proprietary")):
        d = site / f"{name}-1.0.dist-info"
        d.mkdir()
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\nLicense-Expression: {lic}\n")
    return site


def test_corpus_reads_packages_and_single_modules_from_a_site_directory(tmp_path):
    from codila_cli.train.corpus import collect_sources

    site = _site(tmp_path)
    files, lic = collect_sources({"pkga": ("pkga",), "onefile": ("onefile",), "closed": ("closed",),
                                  "absent": ("absent",)}, site, stdlib=False)
    assert sorted(f.relpath for f in files) == ["onefile/onefile.py", "pkga/pkga/__init__.py"]
    assert lic == {"pkga": {"version": "1.0", "license": "MIT"}, "onefile": {"version": "1.0", "license": "BSD-3-Clause"}}


def test_build_corpus_records_the_site_what_it_missed_and_the_prompt_packages(tmp_path):
    from codila_cli.train.corpus import build_corpus

    site = _site(tmp_path)
    m = build_corpus(tmp_path / "corpus", data_dir=None, site=site,
                     packages={"pkga": ("pkga",), "onefile": ("onefile",), "nothere": ("nothere",)})
    assert m["site"] == str(site) and m["not_read"] == ["nothere"]
    assert set(m["never_trained_on"]) == {"development prompts", "external held-out prompts",
                                          "second external held-out prompts", "third external held-out prompts",
                                          "fourth external held-out prompts", "fifth external held-out prompts"}
    rows = [json.loads(x) for f in ("train.jsonl", "valid.jsonl") for x in (tmp_path / "corpus" / f).read_text().splitlines()]
    assert {r["origin"] for r in rows} >= {"pkga", "onefile"}


def test_package_prompts_drop_functions_the_corpus_trained_on(tmp_path):
    from codila_cli.train.prompt_sets import package_prompts

    site = _site(tmp_path)
    train = tmp_path / "train.jsonl"
    train.write_text("")
    both = package_prompts({"pkga": ("pkga",), "onefile": ("onefile",)}, site=site, train_jsonl=train, n=10, prefix="x")
    assert sorted(p["origin"] for p in both) == ["onefile", "pkga"]
    assert all(p["prompt"].rstrip().endswith('"""') and p["reference"].strip() for p in both)
    seen = (site / "onefile.py").read_text() * 3  # long enough for a 20-token window
    train.write_text(json.dumps({"kind": "function", "text": seen}) + "\n")
    left = package_prompts({"pkga": ("pkga",), "onefile": ("onefile",)}, site=site, train_jsonl=train, n=10, prefix="x")
    assert [p["origin"] for p in left] == ["pkga"] and left[0]["id"] == "x/0"


def test_shipped_prompt_sets_come_from_packages_outside_the_corpus():
    from codila_cli.eval.heldout import load_heldout
    from codila_cli.train.corpus import (
        CORPUS_PACKAGES,
        DEV_PACKAGES,
        EXTERNAL2_PACKAGES,
        EXTERNAL3_PACKAGES,
        EXTERNAL4_PACKAGES,
        EXTERNAL5_PACKAGES,
        EXTERNAL_PACKAGES,
    )

    groups = [set(DEV_PACKAGES), set(EXTERNAL_PACKAGES), set(EXTERNAL2_PACKAGES), set(EXTERNAL3_PACKAGES),
              set(EXTERNAL4_PACKAGES), set(EXTERNAL5_PACKAGES)]
    assert not set.union(*groups) & set(CORPUS_PACKAGES)
    assert sum(map(len, groups)) == len(set.union(*groups))  # no package in two sets
    dev, ext = load_heldout(name="dev_ext_prompts.jsonl"), load_heldout(name="heldout_ext_prompts.jsonl")
    ext2, ext3 = load_heldout(name="heldout_ext2_prompts.jsonl"), load_heldout(name="heldout_ext3_prompts.jsonl")
    assert len(dev) == 80 and len(ext) == 120 and len(ext2) == 120 and len(ext3) == 120
    assert {p["origin"] for p in dev} == set(DEV_PACKAGES) and {p["origin"] for p in ext} == set(EXTERNAL_PACKAGES)
    assert {p["origin"] for p in ext2} == set(EXTERNAL2_PACKAGES)
    assert not {p["prompt"] for p in dev} & {p["prompt"] for p in ext}
    assert {p["origin"] for p in ext3} == set(EXTERNAL3_PACKAGES)
    assert not {p["prompt"] for p in dev + ext} & {p["prompt"] for p in ext2}
    assert not {p["prompt"] for p in dev + ext + ext2} & {p["prompt"] for p in ext3}
    ext4 = load_heldout(name="heldout_ext4_prompts.jsonl")
    assert len(ext4) == 120 and {p["origin"] for p in ext4} == set(EXTERNAL4_PACKAGES)
    assert not {p["prompt"] for p in dev + ext + ext2 + ext3} & {p["prompt"] for p in ext4}
    ext5 = load_heldout(name="heldout_ext5_prompts.jsonl")
    assert len(ext5) == 120 and {p["origin"] for p in ext5} == set(EXTERNAL5_PACKAGES)
    assert not {p["prompt"] for p in dev + ext + ext2 + ext3 + ext4} & {p["prompt"] for p in ext5}
    for p in dev + ext + ext2 + ext3 + ext4 + ext5:
        assert p["license"] and p["version"] and p["prompt"].endswith("\n")
        ast.parse(p["prompt"] + p["reference"])  # the original function, cut after its docstring


def test_corpus_packages_file_pins_every_package_read():
    """scripts/corpus-packages.txt installs exactly what the corpus and the prompt sets read, each pinned."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from codila_cli.train.corpus import (
        CORPUS_PACKAGES,
        DEV_PACKAGES,
        EXTERNAL2_PACKAGES,
        EXTERNAL3_PACKAGES,
        EXTERNAL4_PACKAGES,
        EXTERNAL5_PACKAGES,
        EXTERNAL_PACKAGES,
    )

    path = Path(__file__).resolve().parent.parent / "scripts" / "corpus-packages.txt"
    reqs = [Requirement(line) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert all(len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==" for r in reqs), reqs
    wanted = {**CORPUS_PACKAGES, **DEV_PACKAGES, **EXTERNAL_PACKAGES, **EXTERNAL2_PACKAGES, **EXTERNAL3_PACKAGES,
              **EXTERNAL4_PACKAGES, **EXTERNAL5_PACKAGES}
    assert sorted(canonicalize_name(r.name) for r in reqs) == sorted(canonicalize_name(n) for n in wanted)


def test_prompt_set_benchmarks_load_with_stop_lines():
    from codila_cli.decoding.stops import HUMANEVAL
    from codila_cli.eval.benchmarks import load_tasks

    for name, n in (("dev-ext", 80), ("heldout-ext", 120), ("heldout-ext2", 120), ("heldout-ext3", 120),
                    ("heldout-ext4", 120), ("everyday", 6)):
        tasks = load_tasks(name)
        assert len(tasks) == n and all(t.kind == "complete" and t.stop == HUMANEVAL for t in tasks)
    assert all(not t.test for t in load_tasks("heldout-ext"))


def test_bare_prompt_sets_are_the_same_functions_cut_to_their_signature():
    import ast

    from codila_cli.decoding.stops import HUMANEVAL
    from codila_cli.eval.benchmarks import load_tasks

    for base in ("dev-ext", "heldout-ext", "heldout-ext2", "heldout-ext3", "heldout-ext4"):
        full = {t.task_id.removeprefix(base): t for t in load_tasks(base)}
        bare = load_tasks(f"{base}-bare")
        assert len(bare) == len(full) and all(t.stop == HUMANEVAL and not t.test for t in bare)
        for t in bare:
            src = full[t.task_id.removeprefix(f"{base}-bare")].prompt
            assert src.startswith(t.prompt) and len(t.prompt) < len(src)  # the same function, cut shorter
            assert t.prompt.endswith("\n")
            fn = ast.parse(t.prompt + "    pass\n").body[0]
            assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(fn) is None


SOLUTIONS = {
    "fib": "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "is_prime": "    if n < 2:\n        return False\n    return all(n % d for d in range(2, int(n ** 0.5) + 1))\n",
    "gcd": "    while b:\n        a, b = b, a % b\n    return a\n",
    "reverse_string": "    return s[::-1]\n",
    "flatten": "    return [x for sub in xs for x in sub]\n",
    "factorial": "    out = 1\n    for i in range(2, n + 1):\n        out *= i\n    return out\n",
}


@pytest.mark.parametrize("wrong", [False, True])
def test_everyday_tests_pass_a_right_body_and_fail_a_wrong_one(wrong):
    from codila_cli.eval.benchmarks import load_tasks

    for task in load_tasks("everyday"):
        body = "    return None\n" if wrong else SOLUTIONS[task.entry_point]
        r = subprocess.run([sys.executable, "-c", task.program(body)], capture_output=True, timeout=30, check=False)
        assert (r.returncode != 0) is wrong, (task.task_id, r.stderr[-300:])
