"""The bundled model pair ships inside the package and works offline with no flags."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from codila_cli.cli import app
from codila_cli.models.registry import bundled_available

pytestmark = pytest.mark.skipif(not bundled_available("bundled-dlm"), reason="bundled weights not installed")


def test_bundled_pair_loads_from_package_data(monkeypatch):
    from codila_cli.runtime import load_models

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", "/nonexistent-cache")
    models = load_models(dlm="bundled-dlm", ar="bundled-ar", device="cpu", dtype="float32")
    assert models.dlm.specials.mask is not None and models.ar is not None
    assert models.bridge.contiguous is False and len(models.bridge.shared_ids) > 8000
    assert "bundled" in str(models.dlm.ckpt.path)


def test_gen_with_no_flags_uses_the_bundled_pair(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = CliRunner().invoke(app, ["gen", "--json", "--seed", "0", "--max-new-tokens", "32", "def fib(n):"])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["decoder"] == "codila" and doc["models"]["dlm"]["name"] == "bundled-dlm"
    assert doc["models"]["ar"]["name"] == "bundled-ar"
    assert doc["text"].startswith("def fib(n):")


def test_bundle_size_cap():
    from codila_cli.models.registry import BUNDLED_DIR

    total = sum(f.stat().st_size for f in BUNDLED_DIR.rglob("*") if f.is_file())
    assert total <= 40 * 2**20


def test_bundled_helper_recommends_its_measured_settings(monkeypatch):
    """The shipped helper was aligned for left-to-right blocks with left context (docs/bundled-models.md):
    `codila gen` with no flags uses its recommendation; a flag still wins."""
    from codila_cli.runtime import recommended_decoding

    rec = recommended_decoding("bundled-ar")
    assert rec.get("candidate_blocks") == 1 and rec.get("ar_context") == 64
    assert rec.get("ar_repetition_penalty", 1.0) > 1.0
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args = ["gen", "--json", "--seed", "0", "--max-new-tokens", "16", "def fib(n):"]
    settings = json.loads(CliRunner().invoke(app, args).stdout)["settings"]
    assert (settings["candidate_blocks"], settings["ar_context"]) == (1, 64)
    assert settings["ar_repetition_penalty"] == rec["ar_repetition_penalty"]
    settings = json.loads(CliRunner().invoke(app, [*args, "--candidate-blocks", "10"]).stdout)["settings"]
    assert settings["candidate_blocks"] == 10
