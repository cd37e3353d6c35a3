"""Bad-input battery and guarantees not covered elsewhere (docs/reliability.md maps each guarantee)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import threading

import pytest
from typer.testing import CliRunner

from codila_cli.cli import app, boundary
from codila_cli.errors import EXIT_RUNTIME
from codila_cli.infill_files import FileChangedError, find_region, patch, read_source, write_in_place

runner = CliRunner()


def test_no_prompt_with_interactive_stdin_exits_2_without_waiting(tiny):
    main, secondary = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-m", "codila_cli", "gen", "--dlm", str(tiny["dlm"])],
                              stdin=secondary, capture_output=True, timeout=60)
    finally:
        os.close(main)
        os.close(secondary)
    assert proc.returncode == 2
    assert proc.stderr.decode().startswith("Error: no prompt given")
    assert proc.stdout == b""


@pytest.mark.parametrize("flag,value", [("--max-new-tokens", "-5"), ("--max-new-tokens", "999999999"),
                                        ("--steps", "0"), ("--block-length", "0"), ("--candidate-blocks", "0"),
                                        ("--parallel-blocks", "100"), ("--tau", "-1"), ("--top-k", "0"),
                                        ("--ar-context", "-1"), ("--threshold", "1.5"), ("--top-p", "0")])
def test_numeric_flags_at_zero_negative_and_absurd(tiny, flag, value):
    r = runner.invoke(app, ["gen", "--dlm", str(tiny["dlm"]), flag, value, "def f("])
    assert r.exit_code == 2, (flag, value, r.stderr)
    assert r.stderr.startswith("Error:") and "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.parametrize("flag,value", [("--initial-masks", "-1"), ("--max-middle-tokens", "-1"),
                                        ("--initial-masks", "100"), ("--steps", "0")])
def test_infill_numeric_flags(tiny, tmp_path, flag, value):
    f = tmp_path / "a.py"
    f.write_text("x = 1\n")
    r = runner.invoke(app, ["infill", str(f), "--line", "1", "--dlm", str(tiny["dlm"]), flag, value])
    assert r.exit_code == 2 and r.stderr.startswith("Error:")
    assert f.read_text() == "x = 1\n"


def test_empty_file_can_be_filled(tiny, tmp_path):
    f = tmp_path / "empty.py"
    f.write_text("")
    r = runner.invoke(app, ["infill", str(f), "--line", "1", "--dlm", str(tiny["dlm"]), "--seed", "0"])
    assert r.exit_code == 0, r.stderr


def test_concurrent_in_place_writes_never_interleave(tmp_path):
    f = tmp_path / "a.py"
    f.write_text("a = 1\n# codila: fill\nb = 2\n")
    src = read_source(str(f))
    region = find_region(src, line=None, lines_range=None)
    versions = [patch(src, region, f"x = {i}\n" * 2000) for i in range(8)]
    outcomes: list[str] = []

    def writer(text: str) -> None:
        try:
            write_in_place(src, text)
            outcomes.append("wrote")
        except FileChangedError:
            outcomes.append("refused")

    threads = [threading.Thread(target=writer, args=(v,)) for v in versions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("wrote") == 1 and outcomes.count("refused") == 7
    assert f.read_text() in versions  # one complete version, never a mix
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py"]


def test_cuda_out_of_memory_becomes_a_clear_error(capsys):
    class OutOfMemoryError(RuntimeError):
        pass

    def boom():
        raise OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    import typer

    with pytest.raises(typer.Exit) as exc:
        boundary(boom, command="gen")
    err = capsys.readouterr().err
    assert exc.value.exit_code == EXIT_RUNTIME
    assert err.startswith("Error: the GPU ran out of memory") and "Hint: lower --max-new-tokens" in err


def test_debug_env_shows_traceback(tiny, monkeypatch):
    import codila_cli.engine.generate as rt

    monkeypatch.setattr(rt, "generate", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("kaboom")))
    monkeypatch.setenv("CODILA_DEBUG", "1")
    r = runner.invoke(app, ["gen", "--dlm", str(tiny["dlm"]), "def f("])
    assert r.exit_code == 1 and isinstance(r.exception, RuntimeError)


def test_config_wrong_type_exit_2(tmp_path, monkeypatch, tiny):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[gen]\nmax_new_tokens = "many"\n')
    monkeypatch.setenv("CODILA_CONFIG", str(cfg))
    r = runner.invoke(app, ["gen", "--dlm", str(tiny["dlm"]), "def f("])
    assert r.exit_code == 2 and "max_new_tokens must be int" in r.stderr


def test_never_trust_remote_code_anywhere():
    import pathlib

    src = pathlib.Path(__file__).resolve().parents[1] / "src"
    offenders = [p for p in src.rglob("*.py") if "trust_remote_code=True" in p.read_text()]
    assert offenders == []
    no_click = [p for p in src.rglob("*.py") if "import click" in p.read_text()]
    assert no_click == []


def test_prompt_argument_does_not_wait_for_a_silent_open_stdin(tiny):
    import time

    proc = subprocess.Popen([sys.executable, "-m", "codila_cli", "gen", "--dlm", str(tiny["dlm"]), "-K", "8",
                             "--max-new-tokens", "8", "--seed", "0", "def f("],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    t0 = time.time()
    try:
        proc.wait(timeout=90)  # stdin stays open and silent: the run must not wait for it
    finally:
        proc.kill()
        proc.stdin.close()
    out, err = proc.stdout.read(), proc.stderr.read()
    assert proc.returncode == 0, err.decode()
    assert out.decode().startswith("def f(") and time.time() - t0 < 90
