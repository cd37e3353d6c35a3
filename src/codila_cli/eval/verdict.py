"""Which names the tests take from the program, for the isolated verdict (eval/sandbox.py).

An isolated run has two jails: the program's (the model's code, nothing else) and the tests' (the
task's tests and its trusted reference code). The tests reach the program only through stand-ins that
send plain data across (jailed/wire.py), so the program can neither see the tests nor reach the
process that decides. This module decides which of the tests' names are the program's:

* with an entry point (HumanEval, HumanEval-Infilling, most task files): the entry point, plus the
  names the tests use that neither the tests, Python's builtins nor the reference define;
* without one (MBPP, assert-only task files): every name the tests use that they do not define
  themselves and that is not a builtin, or that the reference defines (MBPP's ``sum`` shadows the
  builtin): the functions under test, never the reference's versions of them.

Helpers the reference defines (HumanEval's ``poly`` for ``find_zero``) stay the reference's, so a
program cannot pass by redefining the yardstick. So do the modules the tests reach: a name the reference
imports (MBPP/596's ``sys``: a program with its own ``sys`` and a fake ``getsizeof`` passed before), and
a standard-library module the tests use only as ``name.attribute``, which the tests' jail imports itself
(:func:`test_modules`).
"""

from __future__ import annotations

import ast
import builtins
import sys


def _bound_and_used(code: str) -> tuple[set[str], set[str]]:
    tree = ast.parse(code)
    used, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (used if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
    return bound, used


def top_level_names(code: str) -> set[str]:
    """Names a module binds at its top level (empty if it does not parse)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        else:
            names.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    return names


def imported_names(code: str) -> set[str]:
    """Names a module binds at its top level by ``import`` (empty if it does not parse)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return set()
    return {(a.asname or a.name).split(".")[0] for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
            for a in node.names}


def test_modules(test: str, reference: str) -> list[str]:
    """Standard-library modules the tests use without importing them and only as ``name.attribute``,
    that the reference does not define otherwise: the tests' jail imports them itself."""
    try:
        tree = ast.parse(test)
        bound, _ = _bound_and_used(test)
    except (SyntaxError, ValueError):
        return []
    base_ids = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    as_base, otherwise = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            (as_base if id(node) in base_ids else otherwise).add(node.id)
    names = as_base - otherwise - bound
    defined = top_level_names(reference) - imported_names(reference)
    return sorted(n for n in names if n in sys.stdlib_module_names and n not in defined)


def program_names(test: str, *, entry_point: str | None, reference: str) -> list[str]:
    """The names the tests' jail binds to the program's values, entry point first."""
    try:
        bound, used = _bound_and_used(test)
    except (SyntaxError, ValueError):
        return [entry_point] if entry_point else []  # the tests' own jail reports the syntax error
    free = used - bound - set(dir(builtins)) - set(test_modules(test, reference))
    if entry_point:
        free -= top_level_names(reference)
        return [entry_point, *sorted(free - {entry_point})]
    defined = top_level_names(reference) - imported_names(reference)  # the functions under test
    return sorted((free - imported_names(reference)) | ((used - bound) & defined))


def reference_for(*, kind: str, prompt: str, reference: str) -> str:
    """The trusted code the tests' jail runs first: the task's reference, else a completion prompt that
    compiles on its own (a signature with its docstring, and the helpers above it)."""
    if reference or kind != "complete":
        return reference
    try:
        compile(prompt, "prompt.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return ""
    return prompt
