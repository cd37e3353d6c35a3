"""The lent-GPU scripts (scripts/gpu_*.sh) run once, on a machine with minutes of budget and no second try:
every `codila …` and `python benchmarks/….py …` line they hold must name only options that command has
(scripts/gpu_exact.sh passed `codila eval --temperature 0`, an option eval does not have, so each of its
HumanEval runs would have died on a usage error)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from shared_data import DATA

from codila_cli.cli import app

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "scripts").glob("gpu_*.sh"))


def _text(script: Path) -> str:
    """The script's text, and that of scripts/lib/gpu_setup.sh where it sources that."""
    text = script.read_text()
    return text + (ROOT / "scripts" / "lib" / "gpu_setup.sh").read_text() if "/lib/gpu_setup.sh" in text else text


def _commands(script: Path) -> list[list[str]]:
    """Each `codila …` / `python benchmarks/… …` command of ``script`` (continuations joined), as the shell
    splits it: words up to the next operator (``||``, ``|``, ``;``, ``>``, ``&&``, ``(``)."""
    text = re.sub(r"\\\n\s*", " ", _text(script))
    text = re.sub(r"<<'(\w+)'(.*?)\n.*?\n\1\n", r"\2\n", text, flags=re.DOTALL)  # a here-document's body is not shell
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
                if words == ["codila"] and token.startswith("("):  # the scripts' `codila() { … }` function
                    words = []
                    continue
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


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_script_runs_from_the_source_tree_on_a_bare_device(script):
    """A lent GPU has python3 with torch, and no `codila` entry point, no `python` beside it and no package of
    codila's installed (docs: the device's README): a script runs the source tree (PYTHONPATH), calls
    `codila` only through the function that runs `python3 -m codila_cli`, and `python3`, never `python`."""
    text = _text(script)
    commands = _commands(script)
    assert 'export PYTHONPATH="$PWD/src:' in text, f"{script.name} does not run the source tree"
    assert not [w for w in commands if w[0] == "python"], f"{script.name} runs `python` (the device has python3)"
    if any(w[0] == "codila" for w in commands):
        assert 'codila() { python3 -m codila_cli "$@"; }' in text, f"{script.name} needs an installed `codila`"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="codila eval's jail needs bubblewrap (apt install bubblewrap)")
def test_the_exact_and_quantize_scripts_dry_run_on_a_cpu(tmp_path):
    """scripts/gpu_exact.sh and gpu_quantize.sh end to end with DEVICE=cpu and a tiny SDAR checkpoint, and
    small models filed in a Hugging Face cache under the aliases the scripts evaluate (the bundled DLM as
    Dream-Coder, the tiny SDAR as SDAR-8B, the bundled infill model as DreamOn): every part runs, nothing says
    "failed", exact=1 gives exact=0's completions in fp32, and the summaries hold a row per model; with an
    empty cache the HumanEval parts say they were skipped."""
    from codila_cli.models.registry import ALIASES

    cache = tmp_path / "hub"
    bundled = ROOT / "src" / "codila_cli" / "bundled"
    for alias, folder in (("dream-coder", bundled / "dlm"), ("dreamon", bundled / "tasks"),
                          ("sdar-8b", ROOT / "tests" / "fixtures" / "sdar" / "checkpoints" / "sdar-tiny-a")):
        spec = ALIASES[alias]
        repo = cache / ("models--" + spec.repo_id.replace("/", "--"))
        shutil.copytree(folder, repo / "snapshots" / spec.revision)
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(spec.revision)
    data = DATA if (DATA / "human-eval-infilling").is_dir() else None
    env = {**os.environ, "DEVICE": "cpu", "MODELS": "sdar-tiny", "LIMIT": "2", "MAX_NEW": "24", "CODILA_NOTICE": "0",
           "HF_HUB_CACHE": str(cache), "CKPTS": str(tmp_path / "ckpts"), "PATH": f"{Path(sys.executable).parent}:"
           + os.environ["PATH"], **({"DATA": str(data)} if data else {})}
    runs = {}
    for name, extra in (("exact", {"TOKENS": "16", "DTYPES": "float32"}), ("quantize", {"TOKENS": "8"})):
        out = tmp_path / name
        r = subprocess.run(["bash", f"scripts/gpu_{name}.sh"], cwd=ROOT, capture_output=True, text=True, timeout=900,
                           env={**env, **extra, "OUT": str(out)})
        assert r.returncode == 0 and "failed" not in r.stderr, r.stderr[-3000:]
        assert "| sdar-tiny" in (out / "random.md").read_text()
        runs[name] = out
    evals = (runs["exact"] / "evals.md").read_text()
    for model in ("dream-coder", "sdar-8b", *(["dreamon"] if data else [])):
        assert f"| {model} | float32 | 2 of 2 |" in evals, evals  # exact=1: exact=0's completions in fp32
        assert f"| {model} | bfloat16 |" in evals, evals
    evals = (runs["quantize"] / "evals.md").read_text()
    assert all(f"| {m} | {q} |" in evals for m in ("dream-coder", "sdar-8b") for q in ("bf16", "int8", "int4")), evals
    assert json.loads((runs["quantize"] / "fit.json").read_text())["models"]
    empty = subprocess.run(["bash", "scripts/gpu_exact.sh"], cwd=ROOT, capture_output=True, text=True, timeout=900,
                           env={**env, "TOKENS": "8", "DTYPES": "float32", "OUT": str(tmp_path / "empty"),
                                "HF_HUB_CACHE": str(tmp_path / "none")})
    assert empty.returncode == 0 and "HumanEval with dream-coder skipped: not in the Hugging Face cache" in empty.stderr
    assert not list((tmp_path / "empty").glob("*-exact0"))
