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
program cannot pass by redefining the yardstick.
"""

from __future__ import annotations

import ast
import builtins


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


def program_names(test: str, *, entry_point: str | None, reference: str) -> list[str]:
    """The names the tests' jail binds to the program's values, entry point first."""
    try:
        bound, used = _bound_and_used(test)
    except (SyntaxError, ValueError):
        return [entry_point] if entry_point else []  # the tests' own jail reports the syntax error
    free = used - bound - set(dir(builtins))
    if entry_point:
        free -= top_level_names(reference)
        return [entry_point, *sorted(free - {entry_point})]
    return sorted(free | ((used - bound) & top_level_names(reference)))


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
