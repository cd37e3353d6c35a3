"""Issue 60, items 9–11: a model folder that lies is refused in one line before anything is built.

Copies of the tiny Dream, LLaDA and SDAR checkpoints (real Hugging Face layouts) with one thing wrong
each: a config field (zero, negative, boolean, NaN, missing, not dividing, far larger than the weights,
nested 200k deep), the weights (wrong shapes, integer dtypes, fewer layers), or a file that is not a
file (a FIFO, /dev/zero). Every one ends in exit 1 with one ``Error:`` line naming the folder and the
field or tensor, never "internal error", a traceback, a tensor dump, or a hang."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from codila_cli.cli import app

FIXTURES = Path(__file__).parent / "fixtures"
LLADA = FIXTURES / "llada" / "checkpoints" / "llada-tiny-a"
SDAR = FIXTURES / "sdar" / "checkpoints" / "sdar-tiny-a"


@pytest.fixture(scope="module")
def sources(tiny):
    return {"dream": tiny["dlm"], "llada": LLADA, "sdar": SDAR}


def _copy(src: Path, dst: Path, edit=None) -> Path:
    shutil.copytree(src, dst)
    if edit is not None:
        cfg = json.loads((dst / "config.json").read_text())
        edit(cfg)
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _set(**kw):
    return lambda cfg: cfg.update(kw)


def _drop(*keys):
    return lambda cfg: [cfg.pop(k) for k in keys]


CONFIG_CASES = [  # (family, edit, words the error must hold)
    ("llada", _set(n_layers=1000000), "n_layers"),
    ("llada", _set(d_model=10**9), "d_model"),
    ("llada", _set(n_heads=0), "n_heads"),
    ("llada", _set(n_heads=-4), "n_heads"),
    ("llada", _set(n_heads=5), "not a multiple"),
    ("llada", _drop("d_model"), "no d_model"),
    ("llada", _set(d_model=True), "d_model"),
    ("llada", _set(embedding_size=0, vocab_size=0), "vocab_size is 0"),
    ("llada", _set(n_layers=1), "n_layers is 1, but the weights hold 2 layers"),
    ("sdar", _set(num_attention_heads=3, head_dim=None), "not a multiple"),
    ("sdar", _set(num_key_value_heads=3), "num_key_value_heads"),
    ("sdar", _set(vocab_size=0), "vocab_size"),
    ("sdar", _set(hidden_size="32"), "hidden_size"),
    ("sdar", _set(block_size=0), "block_size"),
    ("sdar", _set(num_hidden_layers=5), "num_hidden_layers is 5"),
    ("sdar", _set(intermediate_size=64), "tensor"),  # the MLP's weights are 96 wide: their shape is named
    ("sdar", _drop("num_hidden_layers"), "no num_hidden_layers"),
    ("dream", _set(hidden_size=10**9), "hidden_size"),
    ("dream", _set(num_attention_heads=7), "not a multiple"),
    ("dream", _set(vocab_size=-1), "vocab_size"),
    ("dream", _set(vocab_size=999), "999"),
]


def _one_error(r_stderr: str, *needles: str) -> str:
    lines = [ln for ln in r_stderr.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1, r_stderr
    assert "internal error" not in r_stderr and "Traceback" not in r_stderr and "torch.Size" not in r_stderr, r_stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.mark.parametrize("family, edit, words", CONFIG_CASES,
                         ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(CONFIG_CASES)])
def test_a_config_that_lies_is_refused_in_one_line(sources, tmp_path, family, edit, words):
    folder = _copy(sources[family], tmp_path / "ckpt", edit)
    r = CliRunner().invoke(app, ["gen", "--dlm", str(folder), "--max-new-tokens", "8", "--device", "cpu", "def f():"])
    assert r.exit_code == 1, r.output
    _one_error(r.stderr, words, str(folder))


def test_a_nan_size_is_the_checkpoints_fault_not_a_flag(sources, tmp_path):
    folder = _copy(sources["llada"], tmp_path / "ckpt")
    text = (folder / "config.json").read_text().replace('"n_heads": 4', '"n_heads": NaN')
    (folder / "config.json").write_text(text)
    r = CliRunner().invoke(app, ["gen", "--dlm", str(folder), "--max-new-tokens", "8", "def f():"])
    assert r.exit_code == 1 and "--" not in _one_error(r.stderr, "n_heads", "not a whole number")


def test_a_config_nested_200k_deep_is_refused(sources, tmp_path):
    folder = _copy(sources["sdar"], tmp_path / "ckpt")
    cfg = (folder / "config.json").read_text().rstrip().rstrip("}")
    (folder / "config.json").write_text(cfg + ', "deep": ' + "[" * 200_000 + "]" * 200_000 + "}")
    r = CliRunner().invoke(app, ["gen", "--dlm", str(folder), "--max-new-tokens", "8", "def f():"])
    assert r.exit_code == 1
    _one_error(r.stderr, "config.json", "nested too deeply")


def _rewrite_weights(folder: Path, change) -> None:
    from safetensors.torch import load_file, save_file

    state = load_file(str(folder / "model.safetensors"))
    change(state)
    save_file(state, str(folder / "model.safetensors"))


@pytest.mark.parametrize("change, words", [
    (lambda s: s.update({k: v[:, :-1].contiguous() for k, v in s.items() if k.endswith("q_proj.weight")}), "q_proj"),
    (lambda s: s.update({k: v.to(__import__("torch").int32) for k, v in s.items() if k.endswith("k_proj.weight")}),
     "stored as I32"),
    (lambda s: s.update({k: v[:100].contiguous() for k, v in s.items() if k.endswith("embed_tokens.weight")}),
     "100 rows"),
], ids=["shape", "dtype", "embedding"])
def test_weights_that_do_not_match_the_config_are_refused_in_one_line(tmp_path, change, words):
    folder = _copy(SDAR, tmp_path / "ckpt")
    _rewrite_weights(folder, change)
    r = CliRunner().invoke(app, ["gen", "--dlm", str(folder), "--max-new-tokens", "8", "def f():"])
    assert r.exit_code == 1, r.output
    _one_error(r.stderr, words, str(folder))


@pytest.mark.parametrize("what", ["weights-fifo", "config-fifo", "config-dev-zero", "tokenizer-fifo"])
def test_a_file_that_is_not_a_file_is_refused_at_once(sources, tmp_path, what):
    """A FIFO named model.safetensors hung gen and serve for ever (blocked in open, past SIGINT); a
    config.json that is a FIFO or /dev/zero was reported missing. Real subprocesses, bounded by a timeout."""
    folder = _copy(sources["sdar"], tmp_path / "ckpt")
    target = {"weights-fifo": "model.safetensors", "config-fifo": "config.json", "config-dev-zero": "config.json",
              "tokenizer-fifo": "tokenizer.json"}[what]
    (folder / target).unlink()
    if what == "config-dev-zero":
        (folder / target).symlink_to("/dev/zero")
    else:
        os.mkfifo(folder / target)
    r = subprocess.run([sys.executable, "-m", "codila_cli", "gen", "--dlm", str(folder), "--max-new-tokens", "8",
                        "def f():"], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 1, r.stderr
    kind = "a character device" if what == "config-dev-zero" else "a FIFO"
    _one_error(r.stderr, target, kind, "not a regular file", str(folder))
