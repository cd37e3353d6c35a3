"""Documentation that must stay true: docs/cli.md is regenerated from --help."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cli_reference_is_current():
    spec = importlib.util.spec_from_file_location("gen_cli_docs", ROOT / "scripts" / "gen_cli_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert (ROOT / "docs" / "cli.md").read_text() == mod.render(), "run: python scripts/gen_cli_docs.py"


def test_readme_test_command_is_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = 'pip install -q torch==2.13.0 && pip install -q -e ".[test,eval,train,serve]" && python -m pytest'
    assert command in readme and command in ci
