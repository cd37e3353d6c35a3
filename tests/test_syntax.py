from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codila_cli.syntax import check_python, extract_code


def test_valid_code():
    r = check_python("def f(x):\n    return x + 1\n")
    assert r.valid and r.errors == ()


def test_tree_sitter_locates_error():
    r = check_python("def f(x):\n    return (x + \n")
    assert not r.valid
    assert r.errors[0].line >= 2


def test_indentation_error_needs_python_parser():
    code = "def f(x):\n    y = 1\n      return y\n"
    r = check_python(code)
    assert not r.valid
    assert any(e.kind.startswith("python:") or e.kind == "error" for e in r.errors)
    code2 = "def f(x):\nreturn x\n"  # tree-sitter accepts some of these; Python does not
    assert not check_python(code2).valid


def test_messages_explain_each_problem():
    """Python's specific words where it has them (with its column), tree-sitter's view otherwise."""
    # an unclosed docstring: one problem, not tree-sitter's reading of the string's words as code
    r = check_python('def fib(n):\n    """Return a list of the graph G and the\n\n    >>> G =\n')
    assert [(e.line, e.column) for e in r.errors] == [(2, 5)]
    assert r.errors[0].message == "unterminated triple-quoted string literal (detected at line 4)"
    r = check_python("def f(x):\n    return (x + \n")
    assert [(e.line, e.column, e.kind, e.message) for e in r.errors] == [(2, 12, "error", "'(' was never closed")]
    # Python only says "invalid syntax" here: tree-sitter's account is kept
    (e,) = check_python("def f(x):\n    return foo problem\n").errors
    assert (e.line, e.column, e.message) == (2, 12, "unexpected `foo` in return statement")
    (e,) = check_python("def f(:\n    pass\n").errors
    assert (e.kind, e.message) == ("missing )", "missing `)`")
    (e,) = check_python("def f(x):\n  return x\n    y = 2\n").errors  # only Python sees it
    assert (e.line, e.kind, e.message) == (3, "python: unexpected indent", "unexpected indent")
    long = check_python("if x\n    y = 1\nz = (" + "a + " * 20 + "\n")
    assert all(len(e.message) < 80 for e in long.errors)


def test_extract_code_prefers_python_fence():
    text = "Here:\n```text\nnot code\n```\nand\n```python\ndef f():\n    pass\n```\nbye"
    assert extract_code(text) == "def f():\n    pass\n"


def test_extract_unterminated_fence():
    assert extract_code("```python\nx = 1\ny = 2") == "x = 1\ny = 2\n"


def test_extract_without_fence_returns_text():
    assert extract_code("x = 1\n") == "x = 1\n"


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_extract_and_check_never_raise(text):
    out = extract_code(text)
    assert isinstance(out, str)
    report = check_python(out)
    assert all(e.message for e in report.errors)


def test_stderr_syntax_line_gives_the_messages():
    from codila_cli.report import syntax_line as _syntax_line

    line = _syntax_line(check_python("x = [1, 2\ny = 3\n"))
    assert line == "syntax: does not parse, 1 problem(s): line 1 col 5: '[' was never closed"
    assert _syntax_line(check_python("x = 1\n")) == "syntax: parses"
    many = _syntax_line(check_python("".join(f"x{i} = (\n" for i in range(7)) + "if x\n"))
    assert many.startswith("syntax: ") and many.count("; ") <= 4


def test_the_checked_codes_syntax_warnings_are_not_raised():
    """``1.0(2)`` compiles with a SyntaxWarning ("'float' object is not callable"); checking it must not
    warn (a warning would be printed among `codila gen`'s own stderr lines) nor fail."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert check_python("x = 1.0(2)\n").valid
    assert not [w for w in seen if issubclass(w.category, SyntaxWarning)]


def test_the_report_says_parses_and_names_static_findings_in_the_generated_code_only():
    """Issue 41: `parses` is all the report claims; pyflakes' findings are warnings, kept only inside the
    generated span (the prompt's own unused import is not the model's); a problem in the user's text
    says so; --strict's `clean` wants both."""
    from codila_cli.report import clean, syntax_line
    from codila_cli.syntax import check_python

    prompt = "import sys\n\ndef gcd(a):\n"
    completion = "    a //= b\n    import os\n    return a\n"
    r = check_python(prompt + completion, span=(len(prompt), len(prompt + completion)))
    assert r.valid and [(w.line, w.kind) for w in r.warnings] == [(4, "undefined-name"), (5, "unused-import")]
    assert syntax_line(r) == ("syntax: parses; 2 warnings (pyflakes): line 4 col 11: undefined name 'b'; "
                              "line 5 col 5: 'os' imported but unused")
    assert not clean(r) and clean(check_python("def identity(x):\n    return x\n"))
    whole = check_python(prompt + completion)  # no span: the whole text is generated (plan)
    assert "'sys' imported but unused" in [w.message for w in whole.warnings]
    assert syntax_line(check_python("def double(x):\n    return x * 2\n")) == "syntax: parses"
    bad = "def f(:\n"
    r = check_python(bad + "    return 1\n", span=(len(bad), len(bad) + 13))
    assert not r.valid and r.errors[0].where == "given" and "(in the given text)" in syntax_line(r)
    assert syntax_line(r).startswith("syntax: does not parse, 1 problem(s): line 1 col")
    assert r.to_dict()["parses"] is False and r.to_dict()["warnings"] == []


def test_json_valid_is_the_terminals_verdict_for_code_that_looks_wrong():
    """Issue 63: --json said "valid": true for code the terminal called "looks wrong"; scripts read valid."""
    from codila_cli.syntax import check_python

    prompt = "def fib(n):\n"
    wrong = check_python(prompt + "    return n\n", span=(len(prompt), len(prompt) + 13)).to_dict()
    assert wrong["parses"] is True and wrong["looks_wrong"] is True and wrong["valid"] is False
    right = check_python(prompt + "    return n if n < 2 else fib(n - 1) + fib(n - 2)\n", span=(len(prompt), 60)).to_dict()
    assert right["parses"] and right["valid"] and right["looks_wrong"] is False


def test_code_after_a_return_or_raise_looks_wrong():
    """Issue 63: code after `return` was not flagged; it never runs."""
    from codila_cli.checks import looks_wrong

    assert looks_wrong("def f(x):\n    return x + 1\n    y = 2\n") == (
        (3, 5, "in `f`, the code after the `return` on line 2 never runs"),)
    assert looks_wrong("def f(x):\n    if x:\n        raise ValueError(x)\n        print(1)\n    return x * 2\n")[0][:2] == (4, 9)
    assert looks_wrong("def f(x):\n    if x:\n        return 1\n    return x * 2\n") == ()


def _where(code: str, fill: str, at: str, language: str) -> set[str]:
    from codila_cli.languages import by_name
    from codila_cli.syntax import check_code

    i = code.index(at)
    full = code[:i] + fill + code[i:]
    return {e.where for e in check_code(full, language=by_name(language), span=(i, i + len(fill))).errors}


@pytest.mark.parametrize("language, code, fill, at", [
    ("java", "class A {\n    int f(int a) {\n        return a;\n    }\n\n    int g(int b) {\n        return b;\n    }\n}\n",
     "        if (a > 0) {\n", "        return a;"),
    ("javascript", "function f(a) {\n  return a;\n}\n\nfunction g(b) {\n  return b;\n}\n", "function h(c) {\n  return c;\n",
     "function g"),
    ("typescript", "function f(a: number): number {\n  return a;\n}\n\nfunction g(b: number): number {\n  return b;\n}\n",
     "function h(c: number): number {\n  if (c > 0) {\n", "function g"),
    ("python", "def f(a):\n    return a\n\n\ndef g(b):\n    return b\n", "def h(c):\n", "def g"),
])
def test_errors_the_fill_caused_are_the_fills_not_the_users(language, code, fill, at):
    """Issue 63: an unclosed bracket the model wrote made later, untouched lines report "(in the given
    text)", and a valid TypeScript prompt was blamed for the Python written after it. The user's text alone
    decides: it has no error, so every error is the fill's."""
    assert _where(code, fill, at, language) == {"generated"}


@pytest.mark.parametrize("language, code, fill, at", [
    ("python", "x = = 1\n\n\ndef f(a):\n    return a\n", "def g(b):\n    return b\n", "def f"),
    ("javascript", "let x = = 1;\n\nfunction f(a) {\n  return a;\n}\n", "function g(b) {\n  return b;\n}\n", "function f"),
])
def test_an_error_already_in_the_users_text_stays_given(language, code, fill, at):
    assert _where(code, fill, at, language) == {"given"}
