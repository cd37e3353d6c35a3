from __future__ import annotations

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
    check_python(out)
