"""Stop lines (decoding/stops.py): where the output is cut, that decoding ends there, and that gen's
streamed, JSON and plain outputs agree."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from codila_cli.cli import app
from codila_cli.decoding.codila import decode_codila
from codila_cli.decoding.config import CodilaConfig, DreamConfig, ThresholdConfig
from codila_cli.decoding.dream import decode_dream
from codila_cli.decoding.stops import HUMANEVAL, stop_offset
from codila_cli.decoding.threshold import decode_threshold


def test_stop_offset_cuts_before_the_first_matching_line():
    body = "    return n\n\ndef g():\n    pass\n"
    assert stop_offset(body, ("def ",), at_line_start=True) == body.index("def g")
    assert body[: stop_offset(body, HUMANEVAL, at_line_start=True)] == "    return n\n\n"
    assert stop_offset("    x = 1\n    if y:\n", ("if ",), at_line_start=True) is None  # indented: not a line start
    assert stop_offset("def g():\n", ("def ",), at_line_start=True) == 0
    # the first line continues the prompt's last line: it does not count
    assert stop_offset("def g():\n    pass\ndef h", ("def ",), at_line_start=False) == len("def g():\n    pass\n")
    assert stop_offset("no newline at all", ("no",), at_line_start=False) is None
    assert stop_offset("x\nde", ("def ",), at_line_start=True) is None  # a prefix not yet complete
    assert stop_offset("anything\n#", (), at_line_start=True) is None


CHARS = {3: "a", 4: "\n", 5: "def", 6: " g", 7: "b", 8: ":", 9: " "}


class CharTokenizer:
    """Decodes ids with a fixed table (enough for Canvas.done's stop-line check)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(CHARS.get(i, "") for i in ids)


TEXT = [3, 4, 7, 4, 5, 6, 8, 4, 9, 3, 4, 7, 7, 7, 7, 7]  # "a\nb\ndef g:\n a\nbbbbb"


def _ltr(scripted):
    """Confidence falling left to right, so slots commit in order."""
    dlm = scripted(TEXT, [0.95 - 0.03 * j for j in range(len(TEXT))])
    dlm.tokenizer = CharTokenizer()
    return dlm


class ArgmaxWriter:
    class _AR:
        forwards = 0

    def __init__(self):
        self.ar = self._AR()

    def write(self, pi, forced, *, context=None, text=None, generator=None):
        import torch

        return torch.tensor([f if f is not None else int(pi[j].argmax()) for j, f in enumerate(forced)])


@pytest.mark.parametrize("decoder", ["dream", "threshold", "codila"])
def test_decoding_ends_once_a_stop_line_is_final(scripted, decoder):
    prompt = [2, 3, 4]  # "...a\n": the prompt ends a line
    runs = {}
    for stop in ((), ("def",)):
        dlm = _ltr(scripted)
        if decoder == "dream":
            res = decode_dream(dlm, prompt, config=DreamConfig(max_new_tokens=16, tokens_per_step=1, stop=stop))
        elif decoder == "threshold":
            res = decode_threshold(dlm, prompt, config=ThresholdConfig(max_new_tokens=16, block_length=4,
                                                                        threshold=0.99, stop=stop))
        else:
            res = decode_codila(dlm, prompt, writer=ArgmaxWriter(),
                                config=CodilaConfig(max_new_tokens=16, block_size=2, candidate_blocks=1, stop=stop))
        runs[stop] = res
    full, cut = runs[()], runs[("def",)]
    assert not full.stopped_early and cut.stopped_early
    assert cut.dlm_forwards < full.dlm_forwards
    n = TEXT.index(5) + 1  # the "def" slot is committed, and everything before it
    assert cut.canvas[:n] == full.canvas[:n] == TEXT[:n]
    assert 0 in cut.canvas  # the rest is filled with end-of-text, as after an end token


@pytest.fixture(scope="module")
def stop_case(tiny):
    """A seed whose dream completion has a generated line, and that line's first two characters."""
    base = ["gen", "--dlm", str(tiny["dlm"]), "--decoder", "dream", "-K", "4", "--temperature", "1",
            "--max-new-tokens", "64", "--json", "--no-early-stop", "def f(x):\n"]
    for seed in range(20):
        doc = json.loads(CliRunner().invoke(app, [*base[:-1], "--seed", str(seed), base[-1]]).stdout)
        c = doc["completion"]
        i = c.find("\n")
        head = c[i + 1 : i + 3] if i >= 0 else ""
        if len(head) == 2 and "\n" not in head and "\r" not in head and c.find(head, 0, i + 1) < 0:
            return seed, head, c, doc["metrics"]["dlm_forwards"]
    pytest.fail("no seed gave a completion with a second line")


def test_gen_stop_cuts_the_output_and_every_form_agrees(tiny, stop_case):
    seed, head, full, forwards = stop_case
    args = ["gen", "--dlm", str(tiny["dlm"]), "--decoder", "dream", "-K", "4", "--temperature", "1",
            "--max-new-tokens", "64", "--seed", str(seed), "--stop", head, "def f(x):\n"]
    doc = json.loads(CliRunner().invoke(app, [*args[:-1], "--json", args[-1]]).stdout)
    cut = full[: full.find("\n") + 1]
    assert doc["completion"] == cut and doc["metrics"]["stop_line"] == head and doc["metrics"]["ended"]
    assert doc["settings"]["stop"] == [head]
    assert doc["metrics"]["dlm_forwards"] <= forwards
    streamed = CliRunner().invoke(app, [*args[:-1], "--stream", args[-1]]).stdout
    whole = CliRunner().invoke(app, [*args[:-1], "--no-stream", args[-1]]).stdout
    assert streamed == whole == doc["text"] == "def f(x):\n" + cut


@pytest.mark.parametrize("bad", ["", "a\nb"])
def test_bad_stop_is_a_usage_error(tiny, bad):
    r = CliRunner().invoke(app, ["gen", "--dlm", str(tiny["dlm"]), "--stop", bad, "def f("])
    assert r.exit_code == 2 and r.stderr.startswith("Error: stop: each prefix is the non-empty start of one line")
