"""The fit check (issue 64, item 2): a load that needs more memory than the device has is refused before
any weight is read, with the numbers and what would fit; ``--no-fit-check`` loads anyway. The limit comes
from ``CODILA_MEMORY_LIMIT`` or a real memory cgroup the command runs in."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codila_cli.cli import app

SDAR = Path(__file__).parent / "fixtures" / "sdar" / "checkpoints" / "sdar-tiny-a"


def test_the_estimate_counts_the_weights_at_the_dtype_they_run_in():
    import json

    from codila_cli.models.fit import CANVAS, estimate
    from codila_cli.models.loading import _weight_files

    cfg = json.loads((SDAR / "config.json").read_text())
    files = _weight_files(SDAR, name="s")
    from safetensors.torch import load_file

    numel = sum(t.numel() for t in load_file(str(files[0])).values())
    fp32, bf16 = estimate(SDAR, cfg, name="s", dtype="float32", files=files), estimate(SDAR, cfg, name="s", dtype="bfloat16", files=files)
    assert fp32.weights == 4 * numel and bf16.weights == 2 * numel
    assert bf16.loading == 0 and fp32.loading == 2 * numel  # stored in bf16: a cast to fp32 holds a file more
    assert fp32.activations >= CANVAS * cfg["vocab_size"] * 4  # the fp32 logits of the canvas at least


def test_a_load_over_the_limit_is_refused_with_the_numbers_and_no_fit_check_loads_anyway(monkeypatch):
    monkeypatch.setenv("CODILA_MEMORY_LIMIT", "300M")
    r = CliRunner().invoke(app, ["gen", "--dtype", "float32", "--max-new-tokens", "4", "def f():"])
    assert r.exit_code == 1 and r.stdout == ""
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith(("Error:", "Hint:"))]
    assert lines[0].startswith("Error: the models need about") and "float32 weights" in lines[0]
    assert "cpu has 300 MiB (CODILA_MEMORY_LIMIT)" in lines[0] and "--no-fit-check" in lines[1]
    monkeypatch.setenv("CODILA_MEMORY_LIMIT", "620M")  # over in fp32, under in bf16: the hint says so
    r = CliRunner().invoke(app, ["gen", "--dtype", "float32", "--max-new-tokens", "4", "def f():"])
    assert r.exit_code == 1 and "Hint: --dtype bfloat16 needs" in r.stderr and ": fits" in r.stderr, r.stderr
    monkeypatch.setenv("CODILA_MEMORY_LIMIT", "300M")
    r = CliRunner().invoke(app, ["gen", "--no-fit-check", "--max-new-tokens", "4", "def f():"])
    assert r.exit_code == 0, r.stderr
    monkeypatch.delenv("CODILA_NO_FIT_CHECK", raising=False)  # the flag's callback set it for this process


def test_a_memory_cgroup_limit_is_what_the_check_reads():
    """Run `codila gen` inside a real child memory cgroup of 300 MiB (v1 or v2): refused, naming the cgroup."""
    from codila_cli.eval.jail import _own, _v2_root

    group, procs = None, None
    if (root := _v2_root()) is not None and _own("") is not None:
        base = root / _own("").lstrip("/")
        if "memory" in (base / "cgroup.subtree_control").read_text(errors="ignore").split():
            group, limit = base / f"codila-fit-{uuid.uuid4().hex[:8]}", "memory.max"
    if group is None and _own("memory") is not None and Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").is_file():
        group, limit = Path("/sys/fs/cgroup/memory") / _own("memory").lstrip("/") / f"codila-fit-{uuid.uuid4().hex[:8]}", \
            "memory.limit_in_bytes"
    if group is None:
        pytest.skip("no memory cgroup below this process's own is writable here")
    try:
        group.mkdir()
        (group / limit).write_text(str(300 * 2**20))
        procs = group / "cgroup.procs"
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here ({exc})")
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("CODILA_MEMORY_LIMIT", "CODILA_NO_FIT_CHECK")}
        code = (f"import os, runpy, sys; open({str(procs)!r}, 'w').write(str(os.getpid())); "
                "sys.argv = ['codila', 'gen', '--dtype', 'float32', '--max-new-tokens', '4', 'def f():']; "
                "runpy.run_module('codila_cli', run_name='__main__')")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, check=False)
        assert r.returncode == 1 and "(the cgroup's memory limit)" in r.stderr, r.stderr
    finally:
        try:
            group.rmdir()
        except OSError:
            pass


def test_models_fit_says_for_each_cached_model_whether_it_fits_and_how(monkeypatch):
    import json

    monkeypatch.setenv("CODILA_MEMORY_LIMIT", "505M")  # the bundled helper in fp32 needs ~512 MiB: bf16 fits
    r = CliRunner().invoke(app, ["models", "--fit", "--json"])
    assert r.exit_code == 0, r.stderr
    rows = {row["alias"]: row for row in json.loads(r.stdout)["models"]}
    ar = rows["bundled-ar"]
    assert ar["dtype"] == "float32" and not ar["fits"] and ar["fits_in_bf16"] and ar["needs_bytes"] > ar["has_bytes"]
    assert rows["dream-coder"]["cached"] is False or "fits" in rows["dream-coder"]
    text = CliRunner().invoke(app, ["models", "--fit"]).stdout
    assert "fits in bfloat16 (--dtype bfloat16) (CODILA_MEMORY_LIMIT)" in text
