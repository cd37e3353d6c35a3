"""Ctrl-C and SIGTERM on a real subprocess: exit 130 promptly, nothing on stdout, files untouched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest


def _interruptible() -> None:
    """In the child before exec: Ctrl-C does its default. A process started in the background by a shell
    without job control (`cmd &` in a script, as CI runners may do) inherits SIGINT ignored, and Python
    then rightly keeps ignoring it, so codila would never see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args, tmp_path, script):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CODILA_TEST_MARKER": str(tmp_path.parent / f"{tmp_path.name}.marker")}
    return subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=env, preexec_fn=_interruptible)


def _wait_for_decoding(proc, tmp_path, timeout=60):
    marker = tmp_path.parent / f"{tmp_path.name}.marker"
    t0 = time.time()
    while not marker.exists() and time.time() - t0 < timeout and proc.poll() is None:
        time.sleep(0.1)
    assert marker.exists(), "decoding never started"
    time.sleep(0.3)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_during_gen_exits_130_with_empty_stdout(tiny, tmp_path, sig, slow_codila):
    proc = _start(["gen", "--dlm", str(tiny["dlm"]), "-K", "1", "--max-new-tokens", "200", "--seed", "0",
                   "--no-early-stop", "def f("], tmp_path, slow_codila)
    _wait_for_decoding(proc, tmp_path)
    t0 = time.time()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert time.time() - t0 < 5
    assert proc.returncode == 130, err.decode()
    assert out == b""
    assert b"Traceback" not in err


def test_signal_during_batched_gen_exits_130_promptly(tiny, tmp_path, slow_codila):
    """`gen -n 3` decodes in worker threads; Ctrl-C still ends the process at once, stdout empty."""
    proc = _start(["gen", "--dlm", str(tiny["dlm"]), "-n", "3", "--temperature", "1", "-K", "1",
                   "--max-new-tokens", "200", "--seed", "0", "--no-early-stop", "def f("], tmp_path, slow_codila)
    _wait_for_decoding(proc, tmp_path)
    t0 = time.time()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert time.time() - t0 < 5
    assert proc.returncode == 130, err.decode()
    assert out == b"" and b"Traceback" not in err


def test_signal_during_infill_leaves_file_untouched(tiny, tmp_path, slow_codila):
    f = tmp_path / "a.py"
    original = b"def f(x):\n    # codila: fill\n    return x\n"
    f.write_bytes(original)
    proc = _start(["infill", str(f), "--dlm", str(tiny["dlm"]), "--in-place", "--max-middle-tokens", "64",
                   "--initial-masks", "60", "--seed", "0"], tmp_path, slow_codila)
    _wait_for_decoding(proc, tmp_path)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err.decode()
    assert f.read_bytes() == original and sorted(p.name for p in tmp_path.iterdir()) == ["a.py", "slow_codila.py"]


def test_a_background_job_that_ignores_ctrl_c_keeps_ignoring_it(tiny, tmp_path, slow_codila):
    """A script's `codila gen … &` inherits SIGINT ignored, so that a Ctrl-C meant for the foreground job does
    not stop it; the console script's entry (codila_cli._entry) re-armed it. It stays ignored now, and SIGTERM
    still ends the run with 130 and nothing on stdout."""
    script = tmp_path / "entry_codila.py"
    script.write_text(slow_codila.read_text().replace("from codila_cli.cli import main",
                                                      "from codila_cli._entry import main"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CODILA_TEST_MARKER": str(tmp_path.parent / f"{tmp_path.name}.marker")}
    proc = subprocess.Popen([sys.executable, str(script), "gen", "--dlm", str(tiny["dlm"]), "-K", "1",
                             "--max-new-tokens", "200", "--seed", "0", "--no-early-stop", "def f("],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        _wait_for_decoding(proc, tmp_path)
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        assert proc.poll() is None, proc.stderr.read().decode()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130 and out == b"" and b"Traceback" not in err, err.decode()


def test_a_ctrl_c_while_the_cli_is_still_importing_is_no_traceback():
    """Issue 53: a Ctrl-C in the first second (the CLI still importing, longer under load) printed a raw
    traceback. The console script's entry guards that window: "Interrupted." and exit 130, as later."""
    import subprocess
    import sys

    code = ("import os, signal, time\nfrom codila_cli._entry import guard\nguard()\n"
            "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\nprint('not reached')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 130 and r.stderr == "Interrupted.\n" and r.stdout == "", r
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "codila"]
    assert script.value == "codila_cli._entry:main"
