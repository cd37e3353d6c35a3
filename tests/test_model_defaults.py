"""A DLM's generation_config.json is its decoding defaults (issue 27, item 6), under every user layer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codila_cli.cli import app


@pytest.fixture()
def dream_with_defaults(tiny, tmp_path) -> Path:
    d = tmp_path / "dlm"
    shutil.copytree(tiny["dlm"], d)
    (d / "generation_config.json").write_text(json.dumps({
        "alg": "maskgit_plus", "temperature": 0.1, "top_p": 0.95, "max_new_tokens": 12, "steps": 6,
        "top_k": "lots", "eos_token_id": 0}))
    return d


def _gen(*args: str) -> dict:
    r = CliRunner().invoke(app, ["gen", "--json", "--seed", "1", *args, "def f("])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_gen_decodes_with_the_checkpoints_generation_config(dream_with_defaults):
    doc = _gen("--dlm", str(dream_with_defaults))
    s = doc["settings"]
    assert (s["alg"], s["max_new_tokens"], s["steps"]) == ("maskgit_plus", 12, 6)
    assert (s["sampling"]["temperature"], s["sampling"]["top_p"], s["sampling"]["top_k"]) == (0.1, 0.95, None)
    src = doc["settings_sources"]
    assert src["alg"] == src["temperature"] == src["steps"] == "model" and src["top_k"] == "default"  # "lots": ignored
    assert doc["metrics"]["tokens"] == 12


def test_flags_environment_and_config_file_win_over_the_model(dream_with_defaults, tmp_path, monkeypatch):
    conf = tmp_path / "c.toml"
    conf.write_text("[gen]\ntop_p = 0.5\n")
    monkeypatch.setenv("CODILA_CONFIG", str(conf))
    monkeypatch.setenv("CODILA_ALG", "entropy")
    doc = _gen("--dlm", str(dream_with_defaults), "--temperature", "0", "--max-new-tokens", "8")
    s, src = doc["settings"], doc["settings_sources"]
    assert s["sampling"]["temperature"] == 0 and src["temperature"] == "flag"
    assert s["alg"] == "entropy" and src["alg"] == "env"
    assert s["sampling"]["top_p"] == 0.5 and src["top_p"] == "config"
    assert s["max_new_tokens"] == 8 and s["steps"] is None  # the model's steps go with its own length only
    assert _gen("--dlm", str(dream_with_defaults), "-K", "2")["settings"]["steps"] is None


def test_do_sample_false_is_greedy_and_the_helper_stays_greedy(dream_with_defaults, tiny):
    cfg = json.loads((dream_with_defaults / "generation_config.json").read_text())
    doc = _gen("--dlm", str(dream_with_defaults), "--ar", str(tiny["ar"]))
    assert doc["settings"]["ar_temperature"] == 0.0  # the DLM's 0.1 is the DLM's, not the helper's
    (dream_with_defaults / "generation_config.json").write_text(json.dumps({**cfg, "do_sample": False}))
    assert _gen("--dlm", str(dream_with_defaults))["settings"]["sampling"]["temperature"] == 0.0


def test_verbose_and_config_show_name_the_model_as_the_source(dream_with_defaults, monkeypatch):
    r = CliRunner().invoke(app, ["gen", "-v", "--dlm", str(dream_with_defaults), "--seed", "0", "def f("])
    assert r.exit_code == 0, r.stderr
    line = next(x for x in r.stderr.splitlines() if x.startswith("sources: "))
    assert "alg=maskgit_plus (model)" in line and "temperature=0.1 (model)" in line
    monkeypatch.setenv("CODILA_MODEL", str(dream_with_defaults))
    show = CliRunner().invoke(app, ["config", "show", "--json"])
    rows = {r["key"]: r for r in json.loads(show.stdout)["settings"]}
    assert rows["gen.alg"]["value"] == "maskgit_plus" and "generation_config.json" in rows["gen.alg"]["source"]


def test_infill_and_plan_start_from_the_dlms_generation_config(tiny, tmp_path):
    """Issue 27: a checkpoint's generation_config.json is infill's and plan's default sampling too
    (alg, temperature, top_p, top_k); a flag wins; --json names where each value came from."""
    import json
    import shutil

    from typer.testing import CliRunner

    from codila_cli.cli import app

    dlm = tmp_path / "dlm"
    shutil.copytree(tiny["dlm"], dlm)
    (dlm / "generation_config.json").write_text(json.dumps(
        {"alg": "maskgit_plus", "temperature": 0.7, "top_p": 0.9, "top_k": 20, "steps": 3}))
    src = tmp_path / "a.py"
    src.write_text("def f(x):\n    # codila: fill\n    return x\n")
    base = ["infill", str(src), "--dlm", str(dlm), "--seed", "0", "--json", "--max-middle-tokens", "8"]
    doc = json.loads(CliRunner().invoke(app, base).stdout)
    assert (doc["settings"]["alg"], doc["settings"]["temperature"], doc["settings"]["top_p"], doc["settings"]["top_k"]) \
        == ("maskgit_plus", 0.7, 0.9, 20)
    assert doc["settings_sources"] == {"temperature": "generation_config.json", "top_p": "generation_config.json",
                                       "top_k": "generation_config.json", "alg": "generation_config.json"}
    doc = json.loads(CliRunner().invoke(app, [*base, "--temperature", "0", "--top-p", "0.5"]).stdout)
    assert doc["settings"]["temperature"] == 0.0 and doc["settings"]["top_p"] == 0.5
    assert doc["settings_sources"]["temperature"] == "flag" and doc["settings_sources"]["alg"] == "generation_config.json"
    (dlm / "generation_config.json").write_text(json.dumps({"alg": "origin", "do_sample": False}))
    doc = json.loads(CliRunner().invoke(app, base).stdout)  # origin has no infill sampler: the default stays
    assert doc["settings"]["alg"] == "entropy" and doc["settings_sources"]["alg"] == "default"
    assert doc["settings"]["temperature"] == 0.0 and doc["settings_sources"]["temperature"] == "generation_config.json"
    (dlm / "generation_config.json").write_text(json.dumps({"temperature": 0.4}))
    r = CliRunner().invoke(app, ["plan", "--dlm", str(dlm), "--seed", "0", "--json", "def add(a, b):"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["settings"]["temperature"] == 0.4


def test_a_generation_config_is_checked_against_the_knob_table(tmp_path):
    """The keys a DLM's generation_config.json may set are the table's ``model`` knobs, each held to its
    knob's kind and range: an out-of-range length, a bool for an int and an unknown alg are ignored and
    named; top_p 1.0 (transformers' "no filter") is a value in range."""
    from codila_cli.decoding.config import GEN_KNOBS
    from codila_cli.models.generation import generation_defaults

    assert [k.name for k in GEN_KNOBS.values() if k.model] == [
        "max_new_tokens", "steps", "temperature", "top_p", "top_k", "alg"]
    (tmp_path / "generation_config.json").write_text(json.dumps({
        "max_new_tokens": 10**6, "steps": True, "top_p": 1.0, "temperature": 1, "alg": "greedy", "top_k": 40,
        "eos_token_id": 2}))
    out, ignored = generation_defaults(tmp_path)
    assert out == {"temperature": 1.0, "top_p": 1.0, "top_k": 40} and isinstance(out["temperature"], float)
    assert sorted(ignored) == ["alg='greedy'", "max_new_tokens=1000000", "steps=True"]
