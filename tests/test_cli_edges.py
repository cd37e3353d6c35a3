"""CLI edges (issue 25, item 5): pipes, closed stdout, conflicting flags, values named by their origin,
a broken chat template, what is knowable before decoding, and control characters on the terminal."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from typer.testing import CliRunner

from codila_cli.cli import app


def test_a_closed_pipe_ends_quietly_with_141(tiny):
    r = subprocess.run(f"{sys.executable} -m codila_cli gen --dlm {tiny['dlm']} --max-new-tokens 256 -K 1 "
                       f"--stream 'def f(' | head -c 1", shell=True, capture_output=True, text=True, timeout=120,
                       executable="/bin/bash", check=False)
    status = subprocess.run(f"{sys.executable} -m codila_cli gen --dlm {tiny['dlm']} --max-new-tokens 256 -K 1 "
                            f"--stream 'def f(' | head -c 1 >/dev/null; echo ${{PIPESTATUS[0]}}", shell=True,
                            capture_output=True, text=True, timeout=120, executable="/bin/bash", check=False)
    assert "Broken pipe" not in r.stderr and "Error" not in r.stderr
    assert status.stdout.strip() in ("0", "141")  # 0 when everything was written before head left


def test_a_closed_stdout_is_refused_before_any_work(tiny, tmp_path):
    f = tmp_path / "a.py"
    f.write_text("x = 1\n# codila: fill\n")
    r = subprocess.run([sys.executable, "-m", "codila_cli", "gen", "--dlm", str(tiny["dlm"]), "def f("],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
                       preexec_fn=lambda: __import__("os").close(1))
    assert r.returncode == 2 and "stdout is closed" in r.stderr
    r = subprocess.run([sys.executable, "-m", "codila_cli", "infill", str(f), "--dlm", str(tiny["dlm"]), "--in-place",
                        "--max-middle-tokens", "4", "--seed", "0"], stderr=subprocess.PIPE, text=True, timeout=60,
                       check=False, preexec_fn=lambda: __import__("os").close(1))
    assert r.returncode == 0, r.stderr  # --in-place needs no stdout


def test_conflicting_flags_are_usage_errors(tiny, tmp_path):
    f = tmp_path / "a.py"
    f.write_text("x = 1\n")
    for args, message in ((["gen", "-q", "-v", "x"], "do not go together"),
                          (["gen", "--ar", str(tiny["ar"]), "--dlm", str(tiny["dlm"]), "-K", "2", "x"], "dream decoder"),
                          (["infill", str(f), "--line", "1", "--diff", "--in-place"], "--diff and --in-place")):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2 and message in r.stderr, (args, r.stderr)


def test_values_from_the_environment_and_config_are_named_as_such(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("CODILA_BLOCK_SIZE", "0")
    r = CliRunner().invoke(app, ["gen", "--dlm", str(tiny["dlm"]), "x"])
    assert r.exit_code == 2 and "CODILA_BLOCK_SIZE" in r.stderr.splitlines()[0]
    monkeypatch.delenv("CODILA_BLOCK_SIZE")
    conf = tmp_path / "c.toml"
    conf.write_text("[gen]\ntop_p = 7\n")
    monkeypatch.setenv("CODILA_CONFIG", str(conf))
    r = CliRunner().invoke(app, ["gen", "--dlm", str(tiny["dlm"]), "x"])
    assert r.exit_code == 2 and str(conf) in r.stderr.splitlines()[0]
    conf.write_text("[runtime]\ndtype = \"fp8\"\n")
    r = CliRunner().invoke(app, ["gen", "--dlm", str(tiny["dlm"]), "x"])
    assert r.exit_code == 2 and "[runtime]" in r.stderr and "fp8" in r.stderr
    monkeypatch.setenv("CODILA_DEVICE", "gpu9")
    conf.write_text("")
    r = CliRunner().invoke(app, ["gen", "--dlm", str(tiny["dlm"]), "x"])
    assert r.exit_code == 2 and "CODILA_DEVICE" in r.stderr


def test_a_broken_chat_template_is_the_models_fault_not_codilas(tiny, tmp_path):
    d = tmp_path / "dlm"
    shutil.copytree(tiny["dlm"], d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{{ raise_exception('no') }}{% for m in messages %}{{ m.content.nope() }}{% endfor %}"
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    r = CliRunner().invoke(app, ["gen", "--dlm", str(d), "x"])
    assert r.exit_code == 1 and "chat template failed" in r.stderr and "internal error" not in r.stderr


def test_plan_refuses_units_that_cannot_fit_before_decoding(tiny, monkeypatch):
    from codila_cli.decoding import sddc

    calls = []
    real = sddc.ContractTemplate
    monkeypatch.setattr(sddc, "ContractTemplate", lambda *a, **k: calls.append(1) or real(*a, **k))
    names = ",".join(f"f{i}" for i in range(32))
    r = CliRunner().invoke(app, ["plan", "--dlm", str(tiny["dlm"]), "--max-units", "32", "--defines", names, "tools"])
    assert r.exit_code == 2 and "cannot fit" in r.stderr and not calls  # no contract was decoded


def test_the_live_view_never_writes_control_characters():
    from codila_cli.ui.live import InfillView, safe

    assert safe("a\x1b]0;owned\x07b\r\tc\x9b") == "a\\x1b]0;owned\\x07b\\x0d\tc\\x9b"
    view = InfillView(prefix="x = '\x1b[2J'\n", suffix="y\x07\n", tokenizer=None, mask_id=0, console=None)
    assert view.before == ["x = '\\x1b[2J'"] and view.after[0] == "y\\x07"
