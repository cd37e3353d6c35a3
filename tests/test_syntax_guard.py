"""The AR helper's syntax guard (decoding/syntax_guard.py): the lexical rules, and the writer that obeys them."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

import pytest
import torch

from codila_cli.decoding.syntax_guard import LexState, SyntaxGuard, feed

SRC = Path(__file__).resolve().parent.parent / "src" / "codila_cli"


@pytest.mark.parametrize("text, ok", [
    ("f(a))", False), ("(]", False), ("x = [1, (2)]", True), ("'abc\n", False), ('"a\\\n"', True),
    ("'''ab\ncd'''", True), ('"""x"""""', True), ("# ) ] }\nx", True), ("s = ')'", True), ("''')'''", True),
    ("f'{x}'", True), ("d = {'a': [1]}", True), ("d = {'a': [1})", False), ("'' ')'", True), ("x = 1\n)", False),
])
def test_rules_agree_with_pythons_tokenizer(text, ok):
    """Where the guard says a text breaks a rule, Python's own parser fails on it for that reason (an
    unmatched bracket, an unterminated one-line string), whatever would follow."""
    assert (feed(LexState(), text) is not None) == ok
    if not ok:
        for tail in ("", "\n", " x]\n"):
            with pytest.raises(SyntaxError, match="unmatched|does not match|unterminated string"):
                compile(text + tail, "<guard>", "exec")


def test_no_complete_source_file_breaks_a_rule():
    """Every prefix of a valid program is allowed: the guard walks all of codila's own modules (and the
    standard library's tokenize and ast) without a break and ends with nothing open."""
    files = sorted(SRC.rglob("*.py")) + [Path(tokenize.__file__), Path(io.__file__)]
    for f in files:
        state = feed(LexState(), f.read_text(encoding="utf-8"))
        assert state is not None and state.stack == () and state.quote == "" and not state.comment, f


def test_state_follows_strings_brackets_and_comments():
    s = feed(LexState(), "x = f(a, [b")
    assert s.stack == ("(", "[")
    assert feed(s, "]") .stack == ("(",) and feed(s, ")") is None
    s = feed(LexState(), "y = ''")  # an empty string: a third quote opens a triple-quoted one
    assert s.quote == "" and feed(s, "'").quote == "'''"
    s = feed(LexState(), 'doc = """a "quoted" word')
    assert s.quote == '"""' and feed(s, ')\n') is not None  # brackets and line breaks are text in there
    assert feed(feed(LexState(), "x = 1  # a (comment"), "\n)") is None


@pytest.fixture(scope="module")
def guard(tiny_models):
    return SyntaxGuard(tiny_models.ar.tokenizer, tiny_models.ar.vocab_rows)


def test_banned_ids_are_exactly_those_that_break_a_rule(guard):
    """``banned`` looks at the ids with a closing bracket or a line break only; no other id can break a rule."""
    assert guard.risky, "the tiny tokenizer has ids with ) ] } or a line break"
    for text in ("f(x", "a = [1, {2", "s = 'ab", "x = 1", "'''doc"):
        state = feed(LexState(), text)
        every = [i for i, t in enumerate(guard.texts) if feed(state, t) is None]
        assert guard.banned(state) == every
    assert guard.banned(feed(LexState(), "x = 1")) == [i for i, t in enumerate(guard.texts) if any(c in t for c in ")]}")]


def test_choose_with_a_guard_equals_the_full_vocabulary_path(tiny_models, guard):
    """The writer's short path (its top few logits) and its full path make the same guarded choice."""
    from codila_cli.decoding.soft_ar import SoftBlockWriter

    w = SoftBlockWriter(tiny_models.ar, tiny_models.bridge, repetition_penalty=1.3, guard=guard)
    V = len(w.allowed)
    g = torch.Generator().manual_seed(0)
    state = feed(LexState(), "x = f(a")
    closers = [i for i in guard.risky if i < V and w.allowed[i]]
    for _ in range(40):
        z = torch.randn(3, V, generator=g) * 3
        z[:, closers[: len(closers) // 2]] += 20.0  # ids with ) ] } or a line break on top of every row
        fed = [int(z[0].argmax()), int(z[1].argmax())]
        states = w._states(state, fed)
        picked = w._choose(z.clone(), set(), fed, None, states)
        assert picked == w._choose_full(z.clone(), set(), fed, None, states)
        assert guard.step(state, picked[0]) is not None


def test_guarded_generation_never_breaks_a_rule(tiny_models):
    """With --ar-syntax-guard the completion, read after its prompt, never closes a bracket it should not
    or breaks a line in a one-line string, greedy or sampled; the tiny random helper without the guard
    does (so the check can fail)."""
    from codila_cli.decoding.config import CodilaConfig
    from codila_cli.runtime import generate

    prompts = ["def f(x):\n    return g(x", "def f(x):\n    s = 'a", "def f(x):\n    y = [x"]
    broken = {}
    for on, temp in ((True, 0.0), (True, 2.0), (False, 2.0)):  # sampled: the greedy tiny helper rarely writes ) ] }
        cfg = CodilaConfig(block_size=4, candidate_blocks=1, max_new_tokens=24, ar_syntax_guard=on, early_stop=False,
                           ar_context=8, ar_temperature=temp)
        broken[on, temp] = sum(feed(LexState(), p + generate(tiny_models, p, decoder="codila", config=cfg,
                                                              seed=seed).completion) is None
                               for seed in range(6) for p in prompts)
    assert broken[True, 0.0] == broken[True, 2.0] == 0
    assert broken[False, 2.0] > 0


def test_the_guard_is_off_for_chat_prompts_and_holes(tiny_models, guard, monkeypatch):
    """A chat answer is not code from its first token: no guard is built for it. A left text with a hole
    (a mask) has no state: the writer then bans nothing. A left text that grows is read on, not again."""
    from codila_cli import runtime
    from codila_cli.decoding.config import CodilaConfig
    from codila_cli.decoding.soft_ar import SoftBlockWriter

    def refuse(ar):
        raise AssertionError("a guard was built")

    monkeypatch.setattr(runtime, "syntax_guard", refuse)
    cfg = CodilaConfig(block_size=4, candidate_blocks=1, max_new_tokens=8, ar_syntax_guard=True)
    ids = tiny_models.dlm.tokenizer.encode("def f(x", add_special_tokens=False)
    runtime._decode(tiny_models, tiny_models.dlm, tiny_models.ar, ids, decoder="codila", config=cfg,
                    gen=torch.Generator().manual_seed(0), on_step=lambda e: None, raw=False)
    with pytest.raises(AssertionError, match="a guard was built"):
        runtime._decode(tiny_models, tiny_models.dlm, tiny_models.ar, ids, decoder="codila", config=cfg,
                        gen=torch.Generator().manual_seed(0), on_step=lambda e: None, raw=True)
    w = SoftBlockWriter(tiny_models.ar, tiny_models.bridge, guard=guard)
    assert w._left_state(None) is None
    ids = tiny_models.ar.tokenizer.encode("x = f(a", add_special_tokens=False)
    assert w._left_state(ids).stack == ("(",)
    more = tiny_models.ar.tokenizer.encode(", b)", add_special_tokens=False)
    monkeypatch.setattr(guard, "initial", refuse)
    assert w._left_state(ids + more).stack == ()  # read on from the last text, not again from the start
