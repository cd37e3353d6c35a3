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
    monkeypatch.setenv("CODILA_MEMORY_LIMIT", "300M")
    try:
        r = CliRunner().invoke(app, ["gen", "--no-fit-check", "--max-new-tokens", "4", "def f():"])
        assert r.exit_code == 0, r.stderr
    finally:
        os.environ.pop("CODILA_NO_FIT_CHECK", None)  # the flag's callback set it for this whole process


def test_a_memory_cgroup_limit_is_what_the_check_reads():
    """Run `codila gen` inside a real child memory cgroup of 768 MiB (v1 or v2), less than the bundled pair in fp32
    needs with the process for a canvas of 2,000 tokens: refused, naming the cgroup."""
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
        (group / limit).write_text(str(768 * 2**20))  # room for the interpreter and torch (not an OOM kill)
        procs = group / "cgroup.procs"
    except OSError as exc:
        pytest.skip(f"cannot make a memory cgroup here ({exc})")
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("CODILA_MEMORY_LIMIT", "CODILA_NO_FIT_CHECK")}
        code = (f"import os, runpy, sys; open({str(procs)!r}, 'w').write(str(os.getpid())); "
                "sys.argv = ['codila', 'gen', '--dtype', 'float32', '--max-new-tokens', '2000', 'def f():']; "
                "runpy.run_module('codila_cli', run_name='__main__')")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, check=False)
        assert r.returncode == 1 and "(the cgroup's memory limit)" in r.stderr, r.stderr
    finally:
        try:
            group.rmdir()
        except OSError:
            pass


def test_the_hint_names_the_first_option_that_fits():
    """Weights in fp32 that would fit in bf16 get that hint; where bf16 is not enough, the first of
    --quantize int8 and int4 that fits; when nothing fits (or bf16 needs as much: small models, whose
    activations dominate and gain a bf16 copy of the logits), the hint says no such thing."""
    from codila_cli.errors import ModelLoadError
    from codila_cli.models.fit import Need, check

    cpu = type("Device", (), {"type": "cuda"})()
    G = 2**30

    def refusal(**options: float) -> str:
        alts = {flag: [Need("m", "x", int(gib * G), 0, G)] for flag, gib in
                zip(("--dtype bfloat16", "--quantize int8", "--quantize int4"), options.values())}
        with pytest.raises(ModelLoadError) as exc:
            check([Need("m", "float32", 12 * G, 0, G)], cpu, options=alts)
        assert "Hint: " not in exc.value.hint
        return exc.value.hint

    os.environ["CODILA_MEMORY_LIMIT"] = "10G"
    try:
        assert refusal(bf16=6, int8=3, int4=2).startswith("--dtype bfloat16 needs 7.00 GiB: fits")
        assert refusal(bf16=10, int8=8, int4=4).startswith("--quantize int8 needs 9.00 GiB: fits")
        assert refusal(bf16=10, int8=9.5, int4=5).startswith("--quantize int4 needs 6.00 GiB: fits")
        assert refusal(bf16=10, int8=10, int4=10).startswith("use a smaller model")
    finally:
        del os.environ["CODILA_MEMORY_LIMIT"]


def test_models_fit_says_for_each_cached_model_whether_it_fits(monkeypatch):
    import json

    from codila_cli.info import list_fit

    monkeypatch.setenv("CODILA_MEMORY_LIMIT", "100G")
    need = {r["alias"]: r["needs_bytes"] for r in list_fit() if r["cached"]}
    limit = (need["bundled-ar"] + need["bundled-dlm"]) // 2  # between the two: the helper fits, the DLM not
    assert need["bundled-ar"] < limit < need["bundled-dlm"]
    monkeypatch.setenv("CODILA_MEMORY_LIMIT", str(limit))
    r = CliRunner().invoke(app, ["models", "--fit", "--json"])
    assert r.exit_code == 0, r.stderr
    rows = {row["alias"]: row for row in json.loads(r.stdout)["models"]}
    assert rows["bundled-ar"]["fits"] and not rows["bundled-dlm"]["fits"] and rows["bundled-dlm"]["has_bytes"] == limit
    assert rows["dream-coder"]["cached"] is False or "fits" in rows["dream-coder"]
    text = CliRunner().invoke(app, ["models", "--fit"]).stdout
    assert "does not fit (CODILA_MEMORY_LIMIT)" in text and "fits (CODILA_MEMORY_LIMIT)" in text
    lines = text.splitlines()  # a column: every row's device starts where the header's does
    assert len({line.index(" cpu ") if " cpu " in line else line.index(" device ") for line in lines}) == 1, text


def test_the_activations_are_sized_for_the_commands_canvas(monkeypatch):
    """`gen` sizes the activations for its --max-new-tokens (plus room for a prompt), not for the longest
    canvas any command might run: under a limit between the two needs, a 16-token gen loads and a
    2,000-token one is refused before loading."""
    import torch

    from codila_cli.engine.models import sized
    from codila_cli.models.cache import resolve_local_dir
    from codila_cli.models.fit import CANVAS, RUNTIME, canvas_for
    from codila_cli.models.registry import resolve_spec

    loads = [(n, resolve_local_dir(resolve_spec(n, kind=k)), torch.float32, "none")
             for n, k in (("bundled-dlm", "dlm"), ("bundled-ar", "ar"))]
    small, large = (sum(x.total for x in sized(loads, canvas=c)[0]) for c in (canvas_for(16), canvas_for(2000)))
    assert canvas_for(16) == 528 and canvas_for(None) == CANVAS and small < large
    monkeypatch.setenv("CODILA_MEMORY_LIMIT", str(RUNTIME + (small + large) // 2))
    ok = CliRunner().invoke(app, ["gen", "--dtype", "float32", "--max-new-tokens", "16", "def f():"])
    assert ok.exit_code == 0, ok.stderr
    refused = CliRunner().invoke(app, ["gen", "--dtype", "float32", "--max-new-tokens", "2000", "def f():"])
    assert refused.exit_code == 1 and "Error:" in refused.stderr and "CODILA_MEMORY_LIMIT" in refused.stderr
