"""Every error the user can meet carries a hint: one `Error:` line and one `Hint:` line on stderr."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import codila_cli
from codila_cli import errors

SRC = Path(codila_cli.__file__).parent
ERROR_NAMES = {name for name, obj in vars(errors).items()
               if isinstance(obj, type) and issubclass(obj, errors.CodilaError)}


def test_every_raised_codila_error_has_a_hint():
    """Source check: each ``UsageError(...)``, ``ModelLoadError(...)`` … built in the package passes
    ``hint=`` (a message alone leaves the user without a next step)."""
    missing = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            if name in ERROR_NAMES and name != "CodilaError" and not any(k.arg in ("hint", None) for k in node.keywords):
                missing.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert ERROR_NAMES >= {"UsageError", "ModelLoadError", "ModelNotFoundError", "StrictSyntaxError"}
    assert missing == []


def test_out_of_range_line_explains_the_range(tmp_path):
    f = tmp_path / "a.py"
    f.write_text("def f(x):\n    return x\n")
    before = f.read_bytes()
    r = subprocess.run([sys.executable, "-m", "codila_cli", "infill", str(f), "--line", "9"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == errors.EXIT_USAGE and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert lines == ["Error: --line 9 is out of range (the file has 2 lines)",
                     "Hint: give a line from 1 to 2, or 3 to append at the end"]
    assert f.read_bytes() == before
