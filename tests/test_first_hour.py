"""Issue 50, a newcomer's first hour: honest first output, threads, pipes, the live view on any
terminal, a C locale, doctor's warnings and the --help examples, each through the real CLI where it can."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from codila_cli.cli import app

runner = CliRunner()
CLI = [sys.executable, "-m", "codila_cli"]
needs_jail = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt install bubblewrap)")


# --- honest first output -------------------------------------------------------------------------------


def test_a_body_that_only_returns_its_argument_looks_wrong_and_an_identity_does_not():
    from codila_cli.checks import looks_wrong
    from codila_cli.report import clean, syntax_line
    from codila_cli.syntax import check_python

    fib = "def fib(n):\n    return n\n"
    r = check_python(fib, span=(len("def fib(n):\n"), len(fib)))
    assert r.valid and not clean(r)
    assert syntax_line(r) == "syntax: parses; looks wrong: line 2: `fib` only returns its argument `n`"
    assert looks_wrong("def f(x):\n    '''doc'''\n    pass\n") == ((3, 5, "`f` has no body (only pass, ... or a docstring)"),)
    assert looks_wrong("def f(x):\n    raise NotImplementedError\n")[0][2] == "`f` only raises NotImplementedError"
    assert looks_wrong("def identity(x):\n    return x\n") == ()
    assert looks_wrong("def fib(n):\n    return fib(n - 1) + fib(n - 2) if n > 1 else n\n") == ()
    given = "def fib(n):\n    return n\n"  # the body is the user's, not the model's
    assert looks_wrong(given + "x = 1\n", span=(len(given), len(given) + 6)) == ()


def _report(syntax, prompt="def f(x):\n", checked=None):
    from codila_cli.cli.gen import _report

    buf = io.StringIO()
    err = Console(file=buf, force_terminal=True, color_system="standard", width=200)
    result = SimpleNamespace(syntax=syntax, metrics={"ended": True})
    _report(result, SimpleNamespace(config=SimpleNamespace(max_new_tokens=8)), None, quiet=False, verbose=False,
            err=err, prompt=prompt, checked=checked)
    return buf.getvalue()


def test_nothing_unchecked_is_shown_green(monkeypatch):
    """Code that merely parses is reported in the terminal's own colour with what would check it; green
    is for a check that ran and held; a failed check is red."""
    monkeypatch.delenv("NO_COLOR", raising=False)
    from codila_cli.checks import DoctestCheck
    from codila_cli.syntax import check_python

    ok = check_python("def f(x):\n    return x * 2\n")
    out = _report(ok)
    assert "syntax: parses; what it does is unchecked" in out and "\x1b[32m" not in out
    out = _report(ok, prompt='def f(x):\n    """\n    >>> f(2)\n    4\n    """\n')
    assert "(--check runs the prompt's 1 doctest)" in out and "\x1b[32m" not in out
    out = _report(ok, checked=DoctestCheck(1, True, "passed"))
    assert "\x1b[32mcheck: the prompt's 1 doctest passes" in out and "unchecked" not in out
    out = _report(ok, checked=DoctestCheck(2, False, "failed", "f(2) gave 5, expected 4"))
    assert "\x1b[31mcheck: FAILED (failed): f(2) gave 5, expected 4" in out


@needs_jail
def test_check_runs_the_prompts_doctests_in_the_jail():
    from codila_cli.checks import prompt_doctests, run_doctests

    prompt = 'def add(a, b):\n    """Add.\n\n    >>> add(2, 3)\n    5\n    >>> add(-1, 1)\n    0\n    """\n'
    assert prompt_doctests(prompt) == 2  # the closing quotes are not expected output
    good = run_doctests(prompt + "    return a + b\n", prompt)
    assert good.passed and good.total == 2 and good.status == "passed"
    bad = run_doctests(prompt + "    return a - b\n", prompt)
    assert not bad.passed and bad.status == "failed" and "add(2, 3) gave '-1', expected '5'" in bad.detail
    hangs = run_doctests(prompt + "    while True:\n        pass\n", prompt, timeout=2)
    assert not hangs.passed and hangs.status == "timeout"
    none = run_doctests("def f():\n    return 1\n", "def f():\n")
    assert none.total == 0 and not none.passed


@needs_jail
def test_check_cannot_be_forged_from_inside_the_program():
    """The doctests ran in the program's own interpreter, so one line of the program (patching doctest's
    checker, parser or summary) turned a wrong answer into a pass (issue 60). They run in a jail of their
    own now, and the program's values cross as data: every forgery fails, honest programs still pass."""
    from codila_cli.checks import example_names, run_doctests

    prompt = 'def add(a, b):\n    """Add.\n\n    >>> add(2, 3)\n    5\n    >>> add(-1, 1)\n    0\n    """\n'
    wrong = prompt + "    return a - b\nimport doctest\n"
    for forgery in ("doctest.OutputChecker.check_output = lambda *a, **k: True",
                    "doctest.DocTestRunner.summarize = lambda *a, **k: doctest.TestResults(0, 2)",
                    "doctest.DocTestParser.get_examples = lambda *a, **k: []",
                    "import builtins\nbuiltins.AssertionError = type('Never', (BaseException,), {})"):
        out = run_doctests(wrong + forgery + "\n", prompt)
        assert not out.passed and out.status == "failed" and "add(2, 3) gave '-1'" in out.detail, (forgery, out)
    # what honest doctests do still holds: printed output, state the examples keep, modules they import
    doc = ('def show(x):\n    """\n    >>> show(3)\n    3\n    >>> xs = [3, 1]\n    >>> sort_it(xs)\n    >>> xs\n'
           '    [1, 3]\n    >>> import math\n    >>> math.floor(half(5))\n    2\n    """\n')
    assert example_names(doc.split('"""')[1]) == ["half", "show", "sort_it"]
    honest = run_doctests(doc + "    print(x)\ndef sort_it(v):\n    v.sort()\ndef half(y):\n    return y / 2\n", doc)
    assert honest.passed and honest.total == 6, honest


@needs_jail
def test_gen_check_reports_on_stderr_and_in_json_and_strict_fails_on_it(tiny):
    prompt = 'def add(a, b):\n    """\n    >>> add(2, 3)\n    5\n    """\n    return a + b\n'
    base = ["gen", "--dlm", str(tiny["dlm"]), "-K", "8", "--max-new-tokens", "8", "--seed", "0", "--stop", "def"]
    r = runner.invoke(app, [*base, "--check", "--json", prompt])
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    from codila_cli.checks import run_doctests

    again = run_doctests(doc["text"], prompt)  # the JSON's verdict is the jail's on the printed program
    assert doc["check"] == {**again.to_dict(), "detail": doc["check"]["detail"]} and doc["check"]["doctests"] == 1
    r = runner.invoke(app, [*base, "--check", prompt])
    assert re.search(r"^check: (the prompt's 1 doctest passes|FAILED)", r.stderr, re.MULTILINE), r.stderr
    if not doc["check"]["passed"]:
        assert runner.invoke(app, [*base, "--check", "--strict", prompt]).exit_code == 4


def test_eval_rows_say_passed_or_failed_before_parsed():
    from codila_cli.eval.runner import row_outcome

    assert row_outcome({"passed": True, "parses": True}) == "passed · parses"
    assert row_outcome({"passed": False, "status": "failed", "parses": True}) == "FAILED · parses"
    assert row_outcome({"passed": False, "status": "timeout", "parses": False}) == "FAILED (timeout) · does not parse"
    assert row_outcome({"passed": None, "parses": True, "empty": False}) == "no tests run · parses"


def test_the_unfinished_note_promises_nothing():
    from codila_cli.report import unfinished_note

    assert unfinished_note(64) == "the canvas (--max-new-tokens 64) filled up before the model wrote its end"


def test_doctor_warns_about_what_a_command_will_refuse(monkeypatch):
    from codila_cli.eval import jail

    monkeypatch.setattr(jail, "detect", lambda: jail.Jail("none", why="bwrap (bubblewrap) is not installed"))
    r = runner.invoke(app, ["doctor"])
    rows = {line[5:25].strip(): line[:4] for line in r.stdout.splitlines()}
    assert rows["eval jail"] == "WARN" and rows["python"] == "ok  "
    assert "Warning: codila eval, gen --check will refuse to run here" in r.stderr
    doc = json.loads(runner.invoke(app, ["doctor", "--json"]).stdout)
    (row,) = [c for c in doc["checks"] if c["name"] == "eval jail"]
    assert row["level"] == "warn" and not row["ok"] and row["refuses"] == "codila eval, gen --check"


# --- threads --------------------------------------------------------------------------------------------


def test_the_default_never_asks_for_every_core(monkeypatch):
    from codila_cli.engine import threads

    assert 1 <= threads.usable_cores() <= (os.cpu_count() or 1)
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    monkeypatch.setattr(threads, "others_running", lambda: 0)
    assert threads.choose_threads(None).count == 1  # one core left free: a busy neighbour never stalls a barrier
    assert threads.choose_threads(0, serve=True).count == 2  # a server owns its machine
    assert threads.choose_threads(2).count == 2 and threads.choose_threads(2).why == "asked"
    monkeypatch.setattr(threads, "usable_cores", lambda: 16)
    monkeypatch.setattr(threads, "others_running", lambda: 3)
    assert threads.choose_threads(None).count == 13
    monkeypatch.setattr(threads, "others_running", lambda: 40)
    assert threads.choose_threads(None).count == 1
    with pytest.raises(ValueError, match="threads"):
        threads.choose_threads(5000)


def test_threads_flag_and_variable_reach_torch(tiny, monkeypatch):
    base = ["gen", "--dlm", str(tiny["dlm"]), "-K", "8", "--max-new-tokens", "8", "--seed", "0", "-v", "def f("]
    for flag, env, want in ((["--threads", "1"], None, 1), ([], "2", 2)):
        if env:
            monkeypatch.setenv("CODILA_THREADS", env)
        r = runner.invoke(app, [base[0], *flag, *base[1:]])
        assert r.exit_code == 0, r.stderr
        assert f"threads: {want}" in r.stderr
    monkeypatch.setenv("CODILA_THREADS", "many")
    r = runner.invoke(app, base)
    assert r.exit_code == 2 and "CODILA_THREADS" in r.stderr
    for command in ("infill", "plan", "eval", "serve"):
        assert "--threads" in runner.invoke(app, [command, "--help"]).stdout, command


# --- pipes ----------------------------------------------------------------------------------------------


def test_piped_text_beside_a_prompt_is_context_and_never_reaches_stdout(tiny, tmp_path):
    """`echo spec | codila gen "def total(xs):"` in a real shell: the spec is read (the model's prompt grows)
    and stdout starts with the prompt, not the spec; a silent open pipe is left unread, with a warning."""
    args = [*CLI, "gen", "--dlm", str(tiny["dlm"]), "-K", "8", "--max-new-tokens", "8", "--seed", "0"]
    cmd = " ".join(shlex.quote(a) for a in args)
    piped = subprocess.run(["bash", "-c", f"echo 'Return the sum.' | {cmd} --json 'def total(xs):'"],
                           capture_output=True, text=True, timeout=120, check=False)
    alone = subprocess.run(["bash", "-c", f"{cmd} --json 'def total(xs):' < /dev/null"],
                           capture_output=True, text=True, timeout=120, check=False)
    assert piped.returncode == alone.returncode == 0, piped.stderr + alone.stderr
    p, a = json.loads(piped.stdout), json.loads(alone.stdout)
    assert p["text"].startswith("def total(xs):") and "Return the sum" not in p["text"]
    assert p["prompt_context"] == "Return the sum.\n\n" and p["metrics"]["prompt_tokens"] > a["metrics"]["prompt_tokens"]


def test_a_silent_open_stdin_is_named_not_waited_for(tiny):
    proc = subprocess.Popen([*CLI, "gen", "--dlm", str(tiny["dlm"]), "-K", "8", "--max-new-tokens", "8", "--seed", "0",
                             "def f("], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.wait(timeout=120)  # stdin stays open and silent
    finally:
        proc.kill()
        proc.stdin.close()
    err = proc.stderr.read().decode()
    assert proc.returncode == 0 and "Warning: stdin is an open pipe with nothing on it" in err


def test_a_pipe_that_sends_text_and_stays_open_is_not_waited_for(tiny):
    """Issue 60: text, then an open pipe, was waited on for ever with no word (the docs say 1 s)."""
    proc = subprocess.Popen([*CLI, "gen", "--dlm", str(tiny["dlm"]), "-K", "8", "--max-new-tokens", "8", "--seed", "0",
                             "--json", "def f("], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(b"some context\n")
        proc.stdin.flush()
        proc.wait(timeout=120)  # stdin stays open and silent after its text
        out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
    finally:
        proc.kill()
        proc.stdin.close()
    assert proc.returncode == 0, err
    assert "Warning: stdin sent 13 bytes, then stayed open and silent for 1 s without ending; it was not used" in err
    assert "prompt_context" not in json.loads(out) or not json.loads(out)["prompt_context"]


def _help_examples(*command: str) -> list[str]:
    """The command lines under a --help's "Examples:" (up to the next unindented heading)."""
    text = runner.invoke(app, [*command, "--help"]).stdout
    if "Examples:" not in text:
        return []
    block = re.split(r"\n(?=\S)", text.split("Examples:", 1)[1], maxsplit=1)[0]
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_every_gen_help_example_runs_as_shown(tmp_path):
    """Each example of `codila gen --help`, run by bash as printed (bundled models, in a folder with the
    spec.md the last one reads): exit 0, code on stdout, JSON where it says JSON."""
    examples = _help_examples("gen")
    assert len(examples) == 5 and any("spec.md" in e for e in examples), examples
    (tmp_path / "spec.md").write_text("Return the sum of a list of numbers.\n")
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "CODILA_NOTICE": "0"}
    for example in examples:
        r = subprocess.run(["bash", "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           env=env, stdin=subprocess.DEVNULL, check=False)
        assert r.returncode == 0, (example, r.stderr[-2000:])
        if "> out.json" in example:
            doc = json.loads((tmp_path / "out.json").read_text())
            assert doc["text"].startswith("Return the sum of a list of numbers.")
        elif "> total.py" in example:  # piped text is the model's context, not the program's first line
            assert (tmp_path / "total.py").read_text().startswith("def total(xs):")
        else:
            assert r.stdout.strip(), example


# --- a C locale -----------------------------------------------------------------------------------------


def test_a_c_locale_reads_utf8_arguments_and_writes_utf8(tiny):
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "LANG": "C"}
    env.pop("PYTHONIOENCODING", None)
    args = [*CLI, "gen", "--dlm", str(tiny["dlm"]), "-K", "8", "--max-new-tokens", "8", "--seed", "0"]
    r = subprocess.run([*args, 'print("h\u00e9llo")'.encode()], capture_output=True, timeout=120, env=env, check=False)
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.startswith('print("h\u00e9llo")'.encode())  # UTF-8 on stdout whatever the locale
    r = subprocess.run([*args, b'print("h\xe9llo")'], capture_output=True, timeout=120, env=env, check=False)
    assert r.returncode == 2 and r.stderr.decode().startswith("Error: an argument is not valid UTF-8 text")


# --- the live view --------------------------------------------------------------------------------------


class _Tok:
    def decode(self, ids, skip_special_tokens=False):
        return {5: "def", 6: " f", 7: "x\n", 8: "(", 9: "<|endoftext|>"}.get(ids[0], "?")


def _render(view, width, height, no_color=False):
    console = Console(file=io.StringIO(), force_terminal=True, color_system="standard", width=width, height=height,
                      no_color=no_color)
    with console.capture() as cap:
        console.print(view.render())
    return cap.get()


@pytest.mark.parametrize(("width", "height"), [(60, 30), (40, 12), (120, 8)])
def test_the_status_and_legend_stay_visible_on_any_terminal(width, height):
    """A 256-slot canvas, 200 of its slots written as lines: taller than the terminal. The status line
    and the whole legend are drawn, the view fits the terminal, and the block being written is shown."""
    from codila_cli.decoding.events import StepEvent
    from codila_cli.ui.live import LiveView

    console = Console(file=io.StringIO(), force_terminal=True, width=width, height=height)
    view = LiveView(tokenizer=_Tok(), mask_id=1, console=console, block_width=4, min_interval=0)
    canvas = (7,) * 196 + (5, 6, 8, 1) + (1,) * 56
    view(StepEvent(0, tuple(range(199)), canvas[:199], "ar", (196, 200), 50, 50, 1.0, canvas,
                   proposed=((199, 8), (200, 5))))
    out = _render(view, width, height)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert len(out.rstrip("\n").split("\n")) <= height - 1
    assert "DLM forwards 50" in plain.replace("\n", " ") and "tok/s" in plain and "…" not in plain
    assert "masked" in plain and "end" in plain.split("\n")[-2]  # the legend's last word on the last row
    assert "def f(" in plain.replace("\n", "")  # the block at the frontier, not the masked tail


def test_dlm_proposed_helper_written_and_committed_tokens_differ_without_colour():
    """NO_COLOR: italic (proposed by the DLM), plain (committed by the DLM), bold (written by the helper),
    each also in the legend."""
    from codila_cli.decoding.events import StepEvent
    from codila_cli.ui.live import LiveView

    console = Console(file=io.StringIO(), force_terminal=True, width=80, height=20, no_color=True)
    view = LiveView(tokenizer=_Tok(), mask_id=1, console=console, block_width=2, min_interval=0)
    view(StepEvent(0, (0,), (5,), "dlm", None, 1, 0, 0.1, (5, 1, 1, 1)))
    view(StepEvent(1, (1,), (6,), "ar", (0, 2), 2, 1, 0.2, (5, 6, 1, 1), proposed=((2, 8),)))
    out = _render(view, 80, 20, no_color=True)
    assert not re.search(r"\x1b\[[0-9;]*3[0-7]m", out)  # no colour at all
    assert "def" in out and "\x1b[1;4m f" in out and "\x1b[2;3m(" in out  # plain, bold (in the block), italic
    legend = out.rstrip("\n").split("\n")[-1]
    assert "\x1b[2;3mproposed" in legend and "\x1b[1mwritten" in legend and "committed" in legend


def test_codila_gen_proposals_reach_the_view(tiny_models):
    """CoDiLA's events carry the DLM's plan for masked slots when a view listens, and none otherwise."""
    from codila_cli.decoding.config import CodilaConfig
    from codila_cli.engine.generate import generate

    seen = []
    generate(tiny_models, "def f(", decoder="codila", config=CodilaConfig(max_new_tokens=16, block_size=4),
             seed=0, on_step=seen.append)
    assert any(e.proposed for e in seen)
    assert all(e.canvas[p] == tiny_models.dlm.specials.mask for e in seen for p, _ in e.proposed)


def test_train_align_names_every_missing_model_as_gen_does(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.py").write_text("x = 1\n")
    r = runner.invoke(app, ["train", "align", "--dlm", "dream-coder", "--ar", "qwen3-0.6b", "--data",
                            str(tmp_path / "data"), "--output", str(tmp_path / "out")])
    assert r.exit_code == 3, r.stderr
    assert "'dream-coder'" in r.stderr and "'qwen3-0.6b'" in r.stderr


@pytest.mark.skipif(importlib.util.find_spec("fastapi") is None, reason="needs the serve extra")
def test_every_serve_help_example_starts_a_server_as_shown(tmp_path):
    """`codila serve --help`'s examples, run by bash as printed (CODILA_PORT=0 picks a free port; $KEY set):
    each listens, answers /health, and stops on SIGTERM."""
    import signal
    import time
    import urllib.request

    examples = _help_examples("serve")
    assert len(examples) == 2, examples
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
           "CODILA_PORT": "0", "KEY": "test-key", "CODILA_NOTICE": "0"}
    for example in examples:
        proc = subprocess.Popen(["bash", "-c", f"exec {example}"], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            port = None
            deadline = time.time() + 120
            while port is None and time.time() < deadline:
                line = proc.stderr.readline()
                assert line or proc.poll() is None, example
                m = re.search(r"listening on http://[^:]+:(\d+)", line)
                port = int(m.group(1)) if m else None
            assert port, example
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as r:
                assert r.status == 200
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) in (0, 130), example
        finally:
            proc.kill()


def test_doctor_has_a_row_for_the_serve_extra(monkeypatch):
    """Issue 63: doctor had rows for [eval] and [train] but none for [serve], so after a plain `pip install .`
    it missed the refusal `codila serve` then gives."""
    from codila_cli import info

    real = info._installed
    monkeypatch.setattr(info, "_installed", lambda dist: dist != "fastapi" and real(dist))
    r = runner.invoke(app, ["doctor", "--json"])
    (row,) = [c for c in json.loads(r.stdout)["checks"] if c["name"] == "extra [serve]"]
    assert not row["ok"] and row["refuses"] == "codila serve" and "pip install 'codila[serve]'" in row["value"]
