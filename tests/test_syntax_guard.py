"""The AR helper's syntax guard (decoding/syntax_guard.py): the lexical rules, and the writer that obeys them."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

import pytest
import torch

from codila_cli.decoding.syntax_guard import LexState, SyntaxGuard, after_token, feed, finished

SRC = Path(__file__).resolve().parent.parent / "src" / "codila_cli"


@pytest.mark.parametrize("text, ok", [
    ("f(a))", False), ("(]", False), ("x = [1, (2)]", True), ("'abc\n", False), ('"a\\\n"', True),
    ("'''ab\ncd'''", True), ('"""x"""""', True), ("# ) ] }\nx", True), ("s = ')'", True), ("''')'''", True),
    ("f'{x}'", True), ("d = {'a': [1]}", True), ("d = {'a': [1})", False), ("'' ')'", True), ("x = 1\n)", False),
])
def test_rules_agree_with_pythons_tokenizer(text, ok):
    """Where the guard says a text breaks rule 1 or 2, Python's own parser fails on it for that reason (an
    unmatched bracket, an unterminated one-line string), whatever would follow."""
    assert (feed(LexState(), text) is not None) == ok
    if not ok:
        for tail in ("", "\n", " x]\n"):
            with pytest.raises(SyntaxError, match="unmatched|does not match|unterminated string"):
                compile(text + tail, "<guard>", "exec")


# rules 3 to 5: each text breaks one, and no text that follows it can make the program valid
BROKEN = [
    ("def f(x):\n    return x\n        y", "unexpected indent"),
    ("def f(x):\nreturn x", "expected an indented block"),
    ("def f(x):\n    # a comment\n\n    if x:\n    return", "expected an indented block"),
    ("class A:\n    def f(self):\n        pass\n  x", "unindent does not match"),
    ("def f(x):\n    return x = 1", "invalid syntax|cannot assign|Maybe you meant"),
    ("if a = b", "invalid syntax|cannot assign|Maybe you meant"),
    ("while x: return y = 2", "invalid syntax|cannot assign|Maybe you meant"),
    ("x = 1; assert x = ", "invalid syntax|cannot assign|Maybe you meant"),
    ("return\ufffd", "invalid character|invalid non-printable"),
    ("x = \ufffd", "invalid character|invalid non-printable"),
    ("if x\n", "expected ':'|invalid syntax"),
    ("def f(x):\n    for y in x\n", "expected ':'|invalid syntax"),
    ("class A(B)  # no colon\n", "expected ':'|invalid syntax"),
    ("x = a === b", "invalid syntax"),
    ("if a <==", "invalid syntax"),
    (">>> f(x)", "invalid syntax"),
    ("def f(x):\n    return x\n    >", "invalid syntax"),
    ("x = 1;;", "invalid syntax"),
    ("if x: , y", "invalid syntax"),
    ("if isinstance(x, int: ", "invalid syntax|never closed"),
    ("print(a: b", "invalid syntax|never closed"),
    ("x = [f(y: 1", "invalid syntax|never closed"),
    ("if not isinstance(x) ->", "invalid syntax"),
    ("x = a->", "invalid syntax"),
    ("def f(x: a->", "invalid syntax|never closed"),
    ("def f(x):\n    return g(x):", "invalid syntax"),
    ("raise ValueError(x):", "invalid syntax"),
    ("async def f():\n    await x:", "invalid syntax|illegal target|assignment expressions"),
    ("not x:", "invalid syntax|illegal target|assignment expressions"),
    ("x = `a", "invalid syntax"), ("x = a ?", "invalid syntax"), ("$", "invalid syntax"),
    ("x = \U0001f600", "invalid character"), ("x = a\u00a0", "invalid non-printable"), ("a\u00b2", "invalid character"),
]
# valid programs close to those rules (each must be read without a break)
FINE = [
    "if x: y = 1\n", "for k in d: d[k] = 1\n", "return lambda x=1: x\n", "x: None = None\n",
    "if (n := len(a)) > 1:\n    pass\n", "while chunk := f.read():\n    pass\n", "match = 1\ntype = 2\n",
    "if a == b and c <= d != e:\n    x **= 2\n", "def f(a, *, b=1) -> int:\n    return a\n",
    "if x:  # a comment\n\n# at column 0\n    y = 1\n", "x = (1,\n2)\n", "if a and \\\n   b:\n    pass\n",
    "class A:\n    def f(self):\n        return 1\n\n    x = 2\ny = 3\n", "s = '\ufffd'  # \ufffd\n",
    "x = 1 if a \\\n    else 2\n", "try: x = 1\nexcept E as e: y = 2\nfinally: z = 3\n",
    "def f():\n    '''doc\nstring'''\n    return [\n  1]\n", "else_ = 1\nreturned = 2\n", "x = ''\n'a'\n",
    "async def f():\n    await g(x=1)\n", "sorted(a, key=lambda v: v)\n", "print(f'{x=}')\n",
    "if x:\t# a tab before a comment\n    y = 1\n", "while x := f():\n    pass\n", "if (a and\n    b):\n    pass\n",
    "class A(B): pass\nelse_ = [x for x in y if x]\n", "def f(x):\n    match x:\n        case 1: return x\n",
    "def g():\n    x = (yield from y)\n    raise ValueError('x') from None\n", "from a import (b,\n    c)\n",
    "async def f():\n    async with a as b:\n        pass\n", "x = a if b else c\ny = [i for i in x if not i]\n",
    "f(*a, **k)\n.5\n-x\n*a, b = c\n~x\n", "x = 1 ;y = 2\n", "x = a == b >= c\nx **= 2\nx //= 3\nx >>= 1\n",
    "pass_ = returned = class_ = 1\nobj.passes = 2\n", "sorted(a, key=lambda v: v[1:])\nf(lambda: 0, lambda x: x)\n",
    "def f(a: int, b: dict[str, int] = {}) -> None:\n    pass\n", "async def f(x: int):\n    pass\n",
    "if (n := 1) and f(m:=2):\n    pass\n", "x = f(a[1:2], {b: c})\n", "class A:\n    def m(self, x: 'A' = None): pass\n", "if x:\n    pass\nelif y: pass\nelse: z = 1\n",
    "def f() -> int: return -1\nasync def g(a=-1) -> 'A': pass\nx = a-1 > b\nx -= 1\n",
    "def f(x):\n    return lambda: x[1:]\n", "def f(x):\n    return {x: lambda y: y}\n", "assert x, f'{a:>3}'\n",
    "def f(x):\n    return (y := x)\n", "import a\nfrom b import c as d\n", "try: pass\nexcept: pass\n",
    "\u00e9t\u00e9 = '`?$\U0001f600'  # `?$ \U0001f600 \u00a0\n\u03c0 = 3.14\n\ufb01x = 1\n",
]


@pytest.mark.parametrize("text, why", BROKEN)
def test_indentation_assignment_and_partial_character_rules_agree_with_compile(text, why):
    assert feed(LexState(), text) is None
    for tail in ("", "\n", " x\n", "=1\n", "\n    pass\n"):
        with pytest.raises(SyntaxError, match=why):
            compile(text + tail, "<guard>", "exec")


@pytest.mark.parametrize("text", FINE)
def test_valid_programs_near_the_rules_are_read_without_a_break(text):
    try:
        compile(text, "<guard>", "exec")
    except SyntaxError as e:  # only `return` outside a function: the guard reads statements, not scopes
        assert "outside function" in str(e)
    state = feed(LexState(), text)
    assert state is not None and state.stack == () and state.quote == ""


def test_the_line_state_follows_indentation_and_statements():
    s = feed(LexState(), "def f(x):\n")
    assert s.expect and s.col == 0 and s.indents == (0,)
    s = feed(s, "    if x:\n        return x\n")
    assert s.indents == (0, 4, 8) and not s.expect
    assert feed(s, "    y") is not None and feed(s, "      y") is None and feed(s, "  # ok\n") is not None
    assert feed(LexState(), "return x =").eq and feed(LexState(), "return x ==").eq is False
    assert feed(LexState(), "\tx = 1\n").indents is None  # a tab: rule 3 is off from there on


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


@pytest.mark.parametrize("text, done", [
    ("x = (1", False), ("x = 1\n", True), ("if x:", False), ("if x:\n", False), ("if x:\n    # body?\n", False),
    ("if x:\n    y\n", True), ("assert x =", False), ("s = '''a", False), ("x = 1  # (", True), ("x = 1 + \\", False),
    ("class A:  # c", False), ("", True), ("while x", False), ("if x: y", True), ("def f(x):\n    '''doc'''\n", True),
    ("x = 1 \\\n", False), ("x = 1 \\\n\n", True), ("x = 1 \\\n   ", True), ("x = 1 \\\n+ 2\n", True),
    ("def f():\n    x = 1 \\\n", False), ("x = (1 \\\n", False),
])
def test_where_a_text_may_end_agrees_with_compile(text, done):
    """Rule 6: the guard lets the text end exactly where Python would accept it as a whole program (for
    these texts, which break no other rule)."""
    state = feed(LexState(), text)
    assert state is not None and finished(state) == done
    if done:
        compile(text, "<guard>", "exec")
    else:
        with pytest.raises(SyntaxError):
            compile(text, "<guard>", "exec")


def test_an_end_of_text_id_is_banned_where_the_text_may_not_end(tiny_models):
    tok = tiny_models.ar.tokenizer
    eos = tiny_models.ar.specials.eos
    guard = SyntaxGuard(tok, tiny_models.ar.vocab_rows, end_ids=(eos,))
    assert eos in guard.risky
    for text, done in (("x = f(a", False), ("x = 1\n", True), ("def f(x):\n", False)):
        state = feed(LexState(), text)
        assert guard.allowed(state, eos) == done and (eos in guard.banned(state)) != done
    plain = SyntaxGuard(tok, tiny_models.ar.vocab_rows)  # no end ids: an end-of-text id is just text ""
    assert plain.allowed(feed(LexState(), "x = f(a"), eos)


@pytest.fixture(scope="module")
def guard(tiny_models):
    return SyntaxGuard(tiny_models.ar.tokenizer, tiny_models.ar.vocab_rows)


def test_banned_ids_are_exactly_those_that_break_a_rule(guard):
    """In mid-line ``banned`` looks at the ids with a closing bracket, a line break, '=' or U+FFFD only;
    at a line's start and after a keyword-led '=' at every id. Either way it bans exactly the ids that
    break a rule."""
    assert guard.risky, "the tiny tokenizer has ids with ) ] } or a line break"
    for text in ("f(x", "a = [1, {2", "s = 'ab", "x = 1", "'''doc", "def f(x):\n", "def f(x):\n    y = 1\n",
                 "def f(x):\n    return x =", "if x: return y", "if x:", "x = 1;", "y = f(a, re",
                 "def f(x):\n    return x", "x = a ==", "s = f(x) ", "for a in b:\n    y = g(a,\n"):
        state = feed(LexState(), text)
        every = [i for i, t in enumerate(guard.texts) if after_token(state, t) is None]
        assert guard.banned(state) == every, text
    mid = guard.banned(feed(LexState(), "x = 1"))
    assert all(i in mid for i, t in enumerate(guard.texts) if any(c in t for c in ")]}\ufffd"))
    at_start = guard.banned(feed(LexState(), "def f(x):\n    if x:\n"))
    assert any(guard.texts[i].strip() and not guard.texts[i].startswith(" ") for i in at_start)


def test_choose_with_a_guard_equals_the_full_vocabulary_path(tiny_models, guard):
    """The writer's short path (its top few logits) and its full path make the same guarded choice."""
    from codila_cli.decoding.rules import GuardRule, RepetitionPenalty
    from codila_cli.decoding.soft_ar import SoftBlockWriter

    w = SoftBlockWriter(tiny_models.ar, tiny_models.bridge,
                        rules=[RepetitionPenalty(1.3, tiny_models.ar.vocab_rows), GuardRule(guard)])
    V = len(w.allowed)
    g = torch.Generator().manual_seed(0)
    state = feed(LexState(), "x = f(a")
    closers = [i for i in guard.risky if i < V and w.allowed[i]]
    for _ in range(40):
        z = torch.randn(3, V, generator=g) * 3
        z[:, closers[: len(closers) // 2]] += 20.0  # ids with ) ] } or a line break on top of every row
        fed = [int(z[0].argmax()), int(z[1].argmax())]
        states = w._row_states(((frozenset(), ()), state), fed)
        picked = w._choose(z.clone(), None, states)
        assert picked == w._choose_full(z.clone(), None, states)
        assert guard.step(state, picked[0]) is not None


def test_guarded_generation_never_breaks_a_rule(tiny_models):
    """With --ar-syntax-guard the completion, read after its prompt, never closes a bracket it should not
    or breaks a line in a one-line string, greedy or sampled; the tiny random helper without the guard
    does (so the check can fail)."""
    from codila_cli.decoding.config import CodilaConfig
    from codila_cli.engine.generate import generate

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


def test_the_writer_ends_the_text_only_where_it_may_end(tiny_models):
    """Rule 6 in the writer: an end-of-text id on top of every row is taken where the text may end and
    passed over where it may not, by the greedy short path and by the sampling path alike."""
    from codila_cli.decoding.rules import GuardRule
    from codila_cli.decoding.soft_ar import SoftBlockWriter

    eos = tiny_models.dlm.specials.eos
    guard = SyntaxGuard(tiny_models.ar.tokenizer, tiny_models.ar.vocab_rows, end_ids=tiny_models.dlm.specials.stop_ids)
    for temp in (0.0, 0.5):
        w = SoftBlockWriter(tiny_models.ar, tiny_models.bridge, temperature=temp, rules=[GuardRule(guard)])
        assert w.allowed[eos], "the tiny helper may write end-of-text"
        z = torch.zeros(1, len(w.allowed))
        z[0, eos] = 50.0
        for text, done in (("def f(x):\n    return g(x", False), ("def f(x):\n    if x:", False),
                           ("def f(x):\n    return x\n", True)):
            (tok,) = w._choose(z.clone(), torch.Generator().manual_seed(0), [(feed(LexState(), text),)])
            assert (tok == eos) == done, (text, temp)


def test_the_guard_is_off_for_chat_prompts_and_holes(tiny_models, guard, monkeypatch):
    """A chat answer is not code from its first token: no guard is built for it. A left text with a hole
    (a mask) has no state: the writer then bans nothing. A left text that grows is read on, not again."""
    import codila_cli.engine.generate as runtime
    from codila_cli.decoding import rules
    from codila_cli.decoding.config import CodilaConfig
    from codila_cli.decoding.rules import GuardRule, Text

    def refuse(ar, **kwargs):
        raise AssertionError("a guard was built")

    monkeypatch.setattr(rules, "syntax_guard", refuse)
    cfg = CodilaConfig(block_size=4, candidate_blocks=1, max_new_tokens=8, ar_syntax_guard=True)
    ids = tiny_models.dlm.tokenizer.encode("def f(x", add_special_tokens=False)
    runtime._decode(tiny_models, tiny_models.dlm, tiny_models.ar, ids, decoder="codila", config=cfg,
                    gen=torch.Generator().manual_seed(0), on_step=lambda e: None, raw=False)
    with pytest.raises(AssertionError, match="a guard was built"):
        runtime._decode(tiny_models, tiny_models.dlm, tiny_models.ar, ids, decoder="codila", config=cfg,
                        gen=torch.Generator().manual_seed(0), on_step=lambda e: None, raw=True)
    rule = GuardRule(guard)
    assert rule.start(Text([], left=None)) is None
    ids = tiny_models.ar.tokenizer.encode("x = f(a", add_special_tokens=False)
    assert rule.start(Text(ids, left=ids)).stack == ("(",)
    more = tiny_models.ar.tokenizer.encode(", b)", add_special_tokens=False)
    monkeypatch.setattr(guard, "initial", refuse)
    assert rule.start(Text(ids, left=ids + more)).stack == ()  # read on from the last text, not again from the start


def test_a_chosen_token_may_not_stop_halfway_into_an_operator():
    """``after_token``: where only ``==`` or ``:=`` could follow, the token must complete it itself."""
    s = feed(LexState(), "def f(x):\n    return x")
    assert after_token(s, " =") is None and after_token(s, " ==") is not None
    p = feed(LexState(), "if f(a")
    assert after_token(p, ":") is None and after_token(p, " :=") is not None and after_token(p, ")") is not None
    assert feed(p, ":") is not None  # the text itself may still go on (into :=)
    assert after_token(feed(LexState(), "x = a"), " =") is not None  # not keyword-led: x = a = b


@pytest.mark.parametrize("redraws", [16, 1])
def test_guarded_sampling_draws_from_the_allowed_ids_in_proportion(tiny_models, guard, monkeypatch, redraws):
    """Sampling strikes out a banned draw and draws again (``_sample``): the ids come out in the
    proportions of softmax(z / T) renormalised over the allowed ids, and a banned id never does, also
    when the redraws run out and the ban is computed in full."""
    from codila_cli.decoding import soft_ar

    monkeypatch.setattr(soft_ar, "_REDRAWS", redraws)
    from codila_cli.decoding.rules import GuardRule

    w = soft_ar.SoftBlockWriter(tiny_models.ar, tiny_models.bridge, temperature=1.0, rules=[GuardRule(guard)])
    state = feed(LexState(), "x = f(a")
    banned = [i for i in guard.banned(state) if w.allowed[i]][:3]
    ok = [i for i in range(len(w.allowed)) if w.allowed[i] and guard.allowed(state, i)][:3]
    z = torch.full((len(w.allowed),), float("-inf"))
    z[banned] = 3.0  # the banned ids carry most of the mass
    z[torch.tensor(ok)] = torch.tensor([0.0, 1.0, 2.0])
    g = torch.Generator().manual_seed(0)
    draws = [w._sample(z.clone(), (state,), g) for _ in range(3000)]
    assert not set(draws) & set(banned)
    p = torch.softmax(torch.tensor([0.0, 1.0, 2.0]), -1).tolist()
    for i, want in zip(ok, p):
        assert abs(draws.count(i) / len(draws) - want) < 0.03


STOPS = ("def ", "class ", "if ", "print(", "#", "@")  # HumanEval's (decoding/stops.py)


@pytest.mark.parametrize("text, tail, ok", [
    ("x = f(1,\n", "# note", False),  # the output would end with '(' open
    ("x = (\n", "print(1)", False), ("def f(x):\n    return g(x,\n", "@d", False),
    ("def f(x):\n    return x\n", "def g(", True),  # the output ends with a whole function
    ("def f(x):\n    return x\n", "    # indented: no stop line", True),
    ("s = '''a\n", "# in a string", False),
    ("x = [1,\n", "if_ = 2]", True),  # "if_" does not start with "if "
    ("x = [1,\n", "de", True), ("x = [1,\n", "class", True), ("x = [1,\n", "class ", False),
])
def test_rule_12_a_stop_line_only_where_the_text_may_end(text, tail, ok):
    """With stop lines the output ends before a generated line that starts with one; such a line is
    allowed only where the text may end (rule 9's test), and a prefix still short of one is allowed."""
    state = feed(LexState(), text, STOPS)
    assert state is not None and (feed(state, tail, STOPS) is not None) == ok
    assert feed(feed(LexState(), text), tail) is not None  # without stop lines rule 12 is off
    if not ok:  # the output, cut before that line, is not a valid program
        from codila_cli.decoding.stops import stop_offset

        assert stop_offset(tail, STOPS, at_line_start=True) == 0
        with pytest.raises(SyntaxError):
            compile(text, "<stop>", "exec")


def test_rule_12_counts_only_lines_that_start_after_the_prompt(tiny_models):
    tok = tiny_models.ar.tokenizer
    guard = SyntaxGuard(tok, tiny_models.ar.vocab_rows, stops=STOPS)
    ids = lambda t: tok.encode(t, add_special_tokens=False)
    hash_ids = [i for i, t in enumerate(guard.texts) if t.startswith("#")]
    assert hash_ids, "the tiny tokenizer has a token that starts with #"
    opened = guard.initial(ids("x = f(1,\n"))  # the prompt ends a line inside brackets
    assert opened.line == "" and opened.unfinished
    assert all(not guard.allowed(opened, i) for i in hash_ids) and set(hash_ids) <= set(guard.banned(opened))
    mid = guard.initial(ids("x = f(1,\n  "))  # the prompt's last line started in the prompt: no stop line
    assert mid.line is None and guard.allowed(mid, hash_ids[0])
    done = guard.initial(ids("def f(x):\n    return x\n"))
    assert not done.unfinished and guard.allowed(done, hash_ids[0])
    assert SyntaxGuard(tok, tiny_models.ar.vocab_rows).initial(ids("x = f(1,\n")).line is None  # no stops: off


def test_guarded_generation_with_stop_lines_ends_where_the_text_may_end(tiny_models):
    """Decoded with HumanEval's stop lines, a guarded completion is never cut by a stop line where the
    text may not end; the same decodes without the guard are (so the check can fail)."""
    import codila_cli.engine.generate as runtime
    from codila_cli.decoding.config import CodilaConfig
    from codila_cli.decoding.stops import stop_offset
    from codila_cli.decoding.syntax_guard import finished

    tok, stops = tiny_models.dlm.tokenizer, set(tiny_models.dlm.specials.stop_ids)
    prompts = ["def f(x):\n    y = g(x,\n", "def f(x):\n    s = \'\'\'a\n", "x = [\n"]
    lines = STOPS + (" ", "x", "s", "(")  # lines the tiny random helper often begins
    cut = {}
    for on in (True, False):
        cfg = CodilaConfig(block_size=4, candidate_blocks=1, max_new_tokens=24, ar_syntax_guard=on, ar_context=8,
                           ar_temperature=2.0, stop=lines)
        cut[on] = 0
        for seed in range(8):
            for p in prompts:
                ids = tok.encode(p, add_special_tokens=False)
                res = runtime._decode(tiny_models, tiny_models.dlm, tiny_models.ar, ids, decoder="codila", config=cfg,
                                      gen=torch.Generator().manual_seed(seed), on_step=lambda e: None)
                canvas = res.canvas[: next((i for i, t in enumerate(res.canvas) if t in stops), len(res.canvas))]
                text = tok.decode(canvas, skip_special_tokens=True)
                at = stop_offset(text, lines, at_line_start=True)
                if at is not None:  # the output is cut there: could the text end at that line's start?
                    state = feed(LexState(indents=None), p + text[:at])
                    cut[on] += state is not None and not finished(state)
    assert cut[True] == 0 and cut[False] > 0


def test_rule_5_bans_exactly_the_characters_python_rejects_in_a_name():
    """Outside strings Python reads a non-ASCII character as part of a name; the guard bans exactly those
    a name may not hold (checked against compile() on a range of code points), and $ ? `."""
    import warnings

    from codila_cli.decoding.syntax_guard import _foreign

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cp in list(range(32, 0x2100)) + [0xFB01, 0xFEFF, 0xFFFD, 0x1F600, 0x1D400]:
            ch = chr(cp)
            if ch in "\"'#\\\x7f" or not ch.isprintable() and cp < 128:
                continue
            try:
                compile(f"a{ch}b = 1\n", "<char>", "exec")
                valid = True
            except SyntaxError:
                valid = False
            if _foreign(ch):
                assert not valid, hex(cp)
            elif cp > 127:
                assert valid, hex(cp)
