"""Does the code look right? What codila can say beyond "it parses" (issue 50), and nothing more.

* :func:`looks_wrong`: cheap structural signs, read with Python's ``ast``, that a function the model
  wrote does not do its job: a body that only returns one of its parameters unchanged (``def fib(n):
  return n``), that does nothing (``pass``, ``...``, a docstring alone), or that only raises
  ``NotImplementedError``, or that has code after a ``return`` or ``raise`` in the same block (it never
  runs). Only functions whose body lies in the generated text are judged.
* :func:`prompt_doctests` / :func:`run_doctests`: the prompt's own doctests (``>>> fib(10)`` then
  ``55``), run against the generated program by ``codila gen --check`` with the isolated verdict of
  ``codila eval`` (eval/verdict.py): the examples run and are compared in a jail of their own, and
  the program's functions answer in the program's jail with plain data, so nothing the program does
  (patching ``doctest``, say) reaches the comparison. A pass means those examples hold; nothing more
  is claimed.

Nothing here prints.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass

NO_OP_NAMES = ("ident", "noop", "no_op", "passthrough", "pass_through", "unchanged", "dummy", "stub")


def _own_body(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # the docstring
    return body


def _offset(lines: list[int], lineno: int, col: int) -> int:
    return lines[lineno - 1] + col


def looks_wrong(code: str, *, span: tuple[int, int] | None = None) -> tuple[tuple[int, int, str], ...]:
    """(line, column, message) for each function whose body looks like no implementation (message:
    ```fib` only returns its argument `n```); with ``span`` (the generated text's character offsets) only
    bodies that start in it. Code that does not parse gives none (the syntax report speaks for it)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return ()
    starts, pos = [], 0
    for line in code.splitlines(keepends=True) or [""]:
        starts.append(pos)
        pos += len(line)
    starts.append(pos)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        body = _own_body(node)
        first = body[0] if body else node.body[0]
        if span is not None and not span[0] <= _offset(starts, first.lineno, first.col_offset) < span[1]:
            continue
        if any(word in node.name.lower() for word in NO_OP_NAMES):
            continue  # an identity or no-op by name: returning the argument is the job
        params = {a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)} - {"self", "cls"}
        where = f"`{node.name}`"
        if not body or all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                                       and s.value.value is Ellipsis) for s in body):
            out.append((first.lineno, first.col_offset + 1, f"{where} has no body (only pass, ... or a docstring)"))
        elif len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Name) \
                and body[0].value.id in params:
            out.append((first.lineno, first.col_offset + 1, f"{where} only returns its argument `{body[0].value.id}`"))
        elif len(body) == 1 and isinstance(body[0], ast.Raise) and "NotImplementedError" in ast.unparse(body[0]):
            out.append((first.lineno, first.col_offset + 1, f"{where} only raises NotImplementedError"))
        out += _after_exit(node, where)
    return tuple(sorted(set(out)))


def _after_exit(fn: ast.AST, where: str) -> list[tuple[int, int, str]]:
    """Statements after a ``return`` or ``raise`` in the same block of ``fn`` (never run; issue 63)."""
    found = []
    for node in ast.walk(fn):
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if not isinstance(block, list):
                continue
            for k, stmt in enumerate(block[:-1]):
                if isinstance(stmt, ast.Return | ast.Raise):
                    dead = block[k + 1]
                    word = "return" if isinstance(stmt, ast.Return) else "raise"
                    found.append((dead.lineno, dead.col_offset + 1,
                                  f"in {where}, the code after the `{word}` on line {stmt.lineno} never runs"))
                    break
    return found


def doctest_text(prompt: str, program: str | None = None) -> str:
    """The docstrings that hold the prompt's examples: of the module, classes and functions that start
    in the prompt, read from ``program`` (the prompt and its completion) when that parses, else from the
    prompt alone, else the prompt's raw text (so a closing ``\"\"\"`` is never read as expected output)."""
    for source in (program, prompt):
        if not source:
            continue
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        limit = prompt.count("\n") + 1
        docs = [ast.get_docstring(node, clean=True) for node in ast.walk(tree)
                if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                and (isinstance(node, ast.Module) or node.lineno <= limit)]
        return "\n\n".join(d for d in docs if d)
    return prompt


def prompt_doctests(prompt: str, program: str | None = None) -> int:
    """How many doctest examples (``>>> …``) the prompt's docstrings hold (:func:`doctest_text`)."""
    import doctest

    try:
        return len(doctest.DocTestParser().get_examples(doctest_text(prompt, program)))
    except ValueError:  # a malformed example (inconsistent indentation)
        return 0


_RUNNER = '''
def _codila_names():  # never called: the names the examples take from the program, for the jail to bind
    return (NAMES)


def _codila_doctests():
    import doctest

    failures = []

    class Runner(doctest.DocTestRunner):
        def report_failure(self, out, test, example, got):
            gave = repr(got.strip()) if got.strip() else "nothing"
            failures.append(f"{example.source.strip()} gave {gave}, expected {example.want.strip()!r}")

        def report_unexpected_exception(self, out, test, example, exc_info):
            failures.append(f"{example.source.strip()} raised {exc_info[0].__name__}: {exc_info[1]}")

    examples = doctest.DocTestParser().get_doctest(DOC_TEXT, dict(globals()), "prompt", "prompt", 0)
    runner = Runner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(examples, out=lambda text: None)
    failed, tried = runner.summarize(verbose=False)
    if failed:
        raise AssertionError(f"{failed} of {tried} doctests fail: " + "; ".join(failures)[:300])
_codila_doctests()
'''


def example_names(doc: str) -> list[str]:
    """The names the doctest examples in ``doc`` read and do not bind themselves (``fib`` in ``>>> fib(3)``):
    the program's values the tests' jail binds (eval/verdict.py::program_names reads them off the test)."""
    import builtins
    import doctest

    read: set[str] = set()
    bound: set[str] = set()
    try:
        examples = doctest.DocTestParser().get_examples(doc)
    except ValueError:
        return []
    for example in examples:
        try:
            tree = ast.parse(example.source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, ast.alias):
                bound.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bound.add(node.name)
    return sorted(read - bound - set(dir(builtins)))


@dataclass(frozen=True)
class DoctestCheck:
    """``codila gen --check``: the prompt's doctests run against the program."""

    total: int  # examples in the prompt
    passed: bool  # every example held (False when any failed, the program did not run, or timed out)
    status: str  # the sandbox's status: passed | failed | error | timeout | killed | no-verdict
    detail: str = ""  # the first failures, shortened

    def to_dict(self) -> dict:
        return {"doctests": self.total, "passed": self.passed, "status": self.status, "detail": self.detail}


def run_doctests(program: str, prompt: str, *, timeout: float = 10.0) -> DoctestCheck:
    """Run ``prompt``'s doctests against ``program`` (the prompt and the completion) with the isolated
    verdict (the examples in a jail of their own, the program's values crossing as data); raises
    the sandbox's UsageError where no jail exists (``codila doctor`` says so)."""
    from codila_cli.eval.sandbox import SandboxLimits, run_sandboxed

    total = prompt_doctests(prompt, program)
    doc = doctest_text(prompt, program)
    names = example_names(doc)
    test = _RUNNER.replace("DOC_TEXT", json.dumps(doc)).replace("NAMES", "".join(f"{n}, " for n in names))
    out = run_sandboxed(program, SandboxLimits(timeout=timeout), test=test, isolated=True)
    detail = out.detail.split("AssertionError: ", 1)[-1] if out.detail else out.stderr_tail[-240:]
    return DoctestCheck(total, out.passed and total > 0, out.status, "" if out.passed else detail.strip())
