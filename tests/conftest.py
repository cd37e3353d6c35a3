"""Shared fixtures: tiny random checkpoints in the real Hugging Face layouts, built once per session,
and scripted stand-in models for exact decoder accounting."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from codila_cli.models.tokens import SpecialTokens


def pytest_configure(config):
    """Every command a test starts without a stdin of its own reads /dev/null, whatever stdin the runner
    gave pytest (a CI runner's open pipe would otherwise be waited for and warned about: prompts.py)."""
    import os

    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)


@pytest.fixture(autouse=True)
def _isolate(tmp_path, monkeypatch):
    monkeypatch.setenv("CODILA_CONFIG", str(tmp_path / "codila-config.toml"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("CODILA_MODEL", raising=False)
    monkeypatch.delenv("CODILA_AR_MODEL", raising=False)
    monkeypatch.delenv("CODILA_DEBUG", raising=False)
    monkeypatch.delenv("CODILA_MEMORY_LIMIT", raising=False)  # a developer's own limit would refuse test loads
    monkeypatch.delenv("CODILA_NO_FIT_CHECK", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    # --dtype auto by the AMX rule, not by a timing probe (models/probe.py): the same dtypes on every run of
    # a machine; tests/test_probe.py turns the probe on where it tests it
    monkeypatch.setenv("CODILA_DTYPE_PROBE", "0")


@pytest.fixture(autouse=True)
def _torch_threads():
    """An in-process command sets torch's thread count (engine/threads.py); the next test starts with
    the process's own again (a training test compares bits with a subprocess's run)."""
    n = torch.get_num_threads()
    yield
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> dict[str, Path]:
    from codila_cli.train.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def tiny_models(tiny):
    from codila_cli.engine.models import load_models

    return load_models(dlm=str(tiny["dlm"]), ar=str(tiny["ar"]), device="cpu", dtype="float32")


SPECIALS = SpecialTokens(mask=1, eos=0, pad=0, bos=2, end_of_turn=None, expand=None, think_open=None, think_close=None)


@dataclass
class ScriptedDLM:
    """A stand-in DLM: slot j of the canvas predicts ``target[j]`` with confidence ``conf[j]``.

    The remaining probability mass is spread evenly, so entropy falls as confidence rises.
    """

    target: list[int]
    conf: list[float]
    prompt_len: int
    vocab: int = 16
    specials: SpecialTokens = SPECIALS
    device: torch.device = torch.device("cpu")
    forwards: int = 0

    def logits(self, x: torch.Tensor, *, rows: tuple[int, int] | None = None) -> torch.Tensor:
        self.forwards += 1
        n = x.shape[1]
        probs = torch.full((1, n, self.vocab), 1.0 / self.vocab)
        for j, (t, c) in enumerate(zip(self.target, self.conf)):
            row = torch.full((self.vocab,), (1 - c) / (self.vocab - 1))
            row[t] = c
            probs[0, self.prompt_len + j] = row
        out = torch.log(probs)
        return out if rows is None else out[:, rows[0] : rows[1]]


@pytest.fixture
def scripted():
    def make(target, conf=None, *, prompt_len=3, vocab=16):
        conf = conf or [0.9] * len(target)
        return ScriptedDLM(list(target), list(conf), prompt_len, vocab)

    return make


SLOW_CODILA = """
import os, sys, time
import codila_cli.models.dream as d
_orig = d.DreamDenoiser.logits
def slow(self, x, **k):
    if os.environ.get("CODILA_TEST_MARKER"):
        open(os.environ["CODILA_TEST_MARKER"], "w").close()  # decoding has started
    time.sleep(float(os.environ.get("CODILA_TEST_DELAY", "0.2")))
    return _orig(self, x, **k)
d.DreamDenoiser.logits = slow
from codila_cli.cli import main
sys.argv = ["codila"] + sys.argv[1:]
main()
"""


@pytest.fixture
def slow_codila(tmp_path):
    """Path of a script that runs `codila …` with every DLM forward slowed down (for real-process tests)."""
    script = tmp_path / "slow_codila.py"
    script.write_text(SLOW_CODILA)
    return script
