"""One safe reader for everything a user gives (issue 40, item 5): devices, FIFOs, huge inputs,
symlink loops and closed directories, through the real CLI; a FIFO must never hang a command, so those
cases run as real processes under a timeout."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from codila_cli.errors import UsageError
from codila_cli.user_input import LIMITS, _why, lines, read_bytes, read_text


def _codila(*args: str, env: dict | None = None, stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "codila_cli", *args], capture_output=True, text=True, timeout=60,
                          stdin=stdin, env={**os.environ, "CODILA_NOTICE": "0", **(env or {})})


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


@pytest.fixture
def loop(tmp_path) -> Path:
    a, b = tmp_path / "a", tmp_path / "b"
    a.symlink_to(b)
    b.symlink_to(a)
    return a


def _one_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    err = r.stderr.splitlines()
    assert err[0].startswith("Error: ") and err[1].startswith("Hint: ") and len(err) == 2, r.stderr
    assert "Traceback" not in r.stderr and "disk" not in r.stderr
    for needle in needles:
        assert needle in err[0], (needle, err[0])


@pytest.mark.parametrize("where", ["config", "prompt-file", "contract", "benchmark", "infill"])
def test_a_fifo_is_refused_at_once_wherever_it_is_given(tiny, fifo, where):
    dlm = ["--dlm", str(tiny["dlm"])]
    r = {"config": lambda: _codila("gen", *dlm, "x", env={"CODILA_CONFIG": str(fifo)}),
         "prompt-file": lambda: _codila("gen", *dlm, "--prompt-file", str(fifo)),
         "contract": lambda: _codila("plan", *dlm, "--contract", str(fifo), "x"),
         "benchmark": lambda: _codila("eval", *dlm, "-b", str(fifo), "-o", str(fifo.parent / "o")),
         "infill": lambda: _codila("infill", *dlm, str(fifo), "--line", "1")}[where]()
    _one_error(r, str(fifo), "is a FIFO")
    assert not (fifo.parent / "o").exists()


def test_a_device_is_refused_and_stdin_from_dev_zero_stops_at_its_cap(tiny):
    _one_error(_codila("gen", "--dlm", str(tiny["dlm"]), "--prompt-file", "/dev/zero"), "/dev/zero", "is a device")
    _one_error(_codila("gen", "x", env={"CODILA_CONFIG": "/dev/zero"}), "config file /dev/zero is a device")
    with open("/dev/zero", "rb") as zero:
        r = _codila("gen", "--dlm", str(tiny["dlm"]), "-", stdin=zero)
    _one_error(r, "stdin holds more than 4 MiB, too large for a prompt")


def test_symlink_loops_are_named_not_internal_errors(tiny, loop):
    _one_error(_codila("infill", "--dlm", str(tiny["dlm"]), str(loop), "--line", "1"), str(loop), "a symlink loop")
    _one_error(_codila("gen", "x", env={"CODILA_CONFIG": str(loop)}), f"config file {loop}: a symlink loop")
    _one_error(_codila("eval", "--dlm", str(tiny["dlm"]), "-b", str(loop)), "a symlink loop")


def test_a_task_file_line_over_the_cap_is_refused_before_any_model_loads(tmp_path):
    path = tmp_path / "big.jsonl"
    big = {"task_id": "big", "prompt": "x" * (LIMITS["task line"] + 10), "test": "", "entry_point": None}
    path.write_text(json.dumps({"task_id": "ok", "prompt": "def f():\n", "test": "", "entry_point": None}) + "\n"
                    + json.dumps(big) + "\n")
    with pytest.raises(UsageError, match=r"big.jsonl line 2 is over the 4 MiB limit for one task"):
        list(lines(path, what="--benchmark"))
    r = _codila("eval", "--dlm", "no-such-model", "-b", str(path), "-o", str(tmp_path / "o"))
    _one_error(r, "line 2 is over the 4 MiB limit")
    assert not (tmp_path / "o").exists()


def test_a_config_with_a_bom_reads_and_one_in_another_encoding_says_so(tmp_path, monkeypatch):
    from codila_cli.config import load_config

    path = tmp_path / "c.toml"
    path.write_bytes(b"\xef\xbb\xbf[models]\ndlm = \"bundled-dlm\"\n")
    assert load_config(path).get("models", "dlm") == "bundled-dlm"
    path.write_bytes("[models]\ndlm = \"é\"\n".encode("latin-1"))
    with pytest.raises(UsageError, match=r"config file .*c.toml is not UTF-8 text \(byte 16\)"):
        load_config(path)
    assert not load_config(tmp_path / "absent" / "c.toml").exists  # absent, with its directory: the defaults


def test_a_closed_directory_on_the_path_is_said_in_plain_words(tmp_path, monkeypatch):
    """Root enters every directory, so the refusal is checked on the message the reader builds."""
    closed = tmp_path / "closed"
    closed.mkdir()
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != closed)
    why, hint = _why(PermissionError(errno.EACCES, "Permission denied"), closed / "config.toml")
    assert why == f"permission denied (the directory {closed} cannot be entered)" and "directories" in hint


def test_sizes_are_capped_per_kind_and_errors_name_the_source(tmp_path):
    path = tmp_path / "contract.txt"
    path.write_bytes(b"#" * (LIMITS["contract"] + 1))
    with pytest.raises(UsageError, match=r"--contract .*contract.txt is 1.0 MiB, over the 1 MiB limit"):
        read_bytes(path, what="--contract", kind="contract")
    path.write_text("fine")
    assert read_text(path, what="--contract", kind="contract") == "fine"
    with pytest.raises(UsageError, match=r"--contract .*: a directory|is a directory"):
        read_bytes(tmp_path, what="--contract", kind="contract")
    with pytest.raises(UsageError, match=r"--contract .*nope: no such file"):
        read_bytes(tmp_path / "nope", what="--contract", kind="contract")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    with pytest.raises(UsageError, match=r"a broken symlink"):
        read_bytes(tmp_path / "dangling", what="--contract", kind="contract")


def test_refused_eval_and_align_runs_leave_no_empty_output_directory(tmp_path):
    """Issue 40: a refused `eval` or `train align` left an empty output directory behind."""
    from typer.testing import CliRunner

    from codila_cli.cli import app

    out = tmp_path / "deep" / "out"
    r = CliRunner().invoke(app, ["eval", "-b", "humaneval", "--dlm", "no-such-model", "-o", str(out), "--limit", "1"])
    assert r.exit_code == 2 and not (tmp_path / "deep").exists(), r.stderr
    r = CliRunner().invoke(app, ["train", "align", "--dlm", "no-such-model", "--ar", "no-such-model", "--data",
                                 str(tmp_path), "--output", str(out), "--steps", "1"])
    assert r.exit_code == 2 and not (tmp_path / "deep").exists(), r.stderr
    (tmp_path / "f").write_text("")
    r = CliRunner().invoke(app, ["eval", "-b", "humaneval", "-o", str(tmp_path / "f" / "x"), "--limit", "1"])
    assert r.exit_code == 2 and r.stderr.startswith(f"Error: cannot write --output {tmp_path / 'f' / 'x'}: ")


def test_benchmark_data_named_by_the_environment_goes_through_the_same_reader(tmp_path):
    (tmp_path / "mbpp").mkdir()
    os.mkfifo(tmp_path / "mbpp" / "sanitized-mbpp.json")
    r = _codila("eval", "-b", "mbpp", "--limit", "1", "-o", str(tmp_path / "o"), env={"CODILA_DATA": str(tmp_path)})
    _one_error(r, "benchmark data", "sanitized-mbpp.json is a FIFO")
