"""The lent-GPU scripts (scripts/gpu_*.sh) run once, on a machine with minutes of budget and no second try:
every `codila …` and `python benchmarks/….py …` line they hold must name only options that command has
(scripts/gpu_exact.sh passed `codila eval --temperature 0`, an option eval does not have, so each of its
HumanEval runs would have died on a usage error)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from codila_cli.cli import app

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "scripts").glob("gpu_*.sh"))


def _commands(script: Path) -> list[list[str]]:
    """Each `codila …` / `python benchmarks/… …` command of ``script`` (continuations joined), as the shell
    splits it: words up to the next operator (``||``, ``|``, ``;``, ``>``, ``&&``, ``(``)."""
    text = re.sub(r"\\\n\s*", " ", script.read_text())
    out = []
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        lex = shlex.shlex(line.replace("$(", "( "), posix=True, punctuation_chars=True)
        lex.commenters = "#"
        words: list[str] = []
        for token in [*lex, ";"]:
            if token and set(token) <= set("|;&<>()"):
                while words and (words[0] in ("do", "then", "else", "time") or "=" in words[0]):
                    words = words[1:]
                if words[:1] == ["codila"] or words[:1] in (["python"], ["python3"]) and _program(words) is not None:
                    out.append(words)
                words = []
            else:
                words.append(token)
    return out


def _program(words: list[str]) -> list[str] | None:
    """What a `python …` line runs, as arguments to python (a benchmark script, or `-m codila_cli.…`)."""
    if words[1:2] and words[1].startswith("benchmarks/"):
        return words[1:2]
    if words[1:2] == ["-m"] and words[2:3] and words[2].startswith("codila_cli"):
        return words[1:3]
    return None


def _options(words: list[str]) -> list[str]:
    """The options named in ``words`` (a value with a space in it, such as a quoted argument list, is a value)."""
    return [w.split("=", 1)[0] for w in words if w.startswith("--") and " " not in w.split("=", 1)[0]]


def _unknown(command: str, options: list[str]) -> list[str]:
    group = typer.main.get_command(app)
    params = group.commands[command].params  # an unknown command fails here
    known = {o for p in params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    return [o for o in options if o not in known]


def test_the_scripts_hold_commands():
    assert len(SCRIPTS) >= 5
    found = {s.name: _commands(s) for s in SCRIPTS}
    assert all(found.values()), {k for k, v in found.items() if not v}
    assert any(w[:2] == ["codila", "eval"] for c in found.values() for w in c)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_codila_line_names_options_its_command_has(script):
    for words in (w for w in _commands(script) if w[0] == "codila"):
        unknown = _unknown(words[1], _options(words[2:]))
        assert not unknown, f"{script.name}: `{' '.join(words[:2])}` has no {', '.join(unknown)}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_line_names_options_the_program_has(script):
    for words in (w for w in _commands(script) if w[0] != "codila"):
        program = _program(words)
        helped = subprocess.run([sys.executable, *program, "--help"], capture_output=True, text=True, timeout=120,
                                cwd=ROOT)
        assert helped.returncode == 0, f"{script.name}: {' '.join(program)} --help: {helped.stderr[-400:]}"
        unknown = [o for o in _options(words[1 + len(program):]) if not re.search(re.escape(o) + r"(?![\w-])", helped.stdout)]
        assert not unknown, f"{script.name}: {' '.join(program)} has no {', '.join(unknown)}"
        for i, word in enumerate(words):  # the arguments a benchmark passes on to `codila serve`
            if word.startswith("--serve-args"):
                value = word.split("=", 1)[1] if "=" in word else words[i + 1]
                unknown = _unknown("serve", _options(value.split()))
                assert not unknown, f"{script.name}: `codila serve` has no {', '.join(unknown)}"
