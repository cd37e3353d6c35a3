"""Syntax report for generated code (every language with a grammar), and code extraction from chat output.

:func:`check_code` checks by language (languages.py): Python as below; another language with a
tree-sitter grammar by tree-sitter alone (no linter: no findings); a language codila has no grammar for
(or none named) gets a report with ``checked`` false, which says "not checked", never "does not parse".

``valid`` requires both tree-sitter (no ERROR / MISSING node) and Python's own parser
(``compile(..., "exec", dont_inherit=True)``): tree-sitter alone misses most indentation errors, and
it is tree-sitter that locates the problems (every one, where Python stops at the first). Each problem
has a ``message`` a person can act on: Python's own words when Python reports a specific error on that
line ("'(' was never closed", "unterminated triple-quoted string literal …"), else tree-sitter's view
("unexpected `foo` in return statement", "missing `)`"). Lines and columns are 1-based.

"Parses" is all ``valid`` claims: code that parses may still be wrong. When it parses, ``warnings`` holds
what looks wrong (checks.py: a function that only returns its argument, or has no body; kind
``looks-wrong``, first) and pyflakes' cheap static findings (undefined names, unused imports and
variables, redefinitions). Given the span of the text that was generated (``span``: character offsets), only the
findings inside it are kept, and each syntax problem says whether the user's own text has it alone
(``where`` "given": the text without the generated span is checked too, and has a problem on that line)
or the output brought it ("generated", wherever the parser reports it).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Any

FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


@dataclass(frozen=True)
class SyntaxIssue:
    line: int
    column: int
    kind: str  # "error" (tree-sitter ERROR node), "missing <token>", or "python: <message>"
    message: str = ""  # what is wrong, in words (see the module docstring)
    where: str = ""  # "generated" or "given" (the user's text) when the caller gave the generated span


@dataclass(frozen=True)
class Finding:
    """A static finding (pyflakes) in code that parses; ``kind`` is pyflakes' message class, kebab-case
    (``undefined-name``, ``unused-import``, ``unused-variable``, ``redefined-while-unused``, …)."""

    line: int
    column: int
    kind: str
    message: str


@dataclass(frozen=True)
class SyntaxReport:
    valid: bool  # the text parses (tree-sitter, and Python's parser for Python); nothing more
    errors: tuple[SyntaxIssue, ...] = field(default_factory=tuple)
    warnings: tuple[Finding, ...] = field(default_factory=tuple)
    language: str | None = "python"  # what it was checked as; None: no language was named or known
    checked: bool = True  # False: no grammar, so nothing was checked (``valid`` is then False and means nothing)

    @property
    def looks_wrong(self) -> bool:
        """A function the generated code defines does no job (checks.py): the terminal says "looks wrong"."""
        return any(w.kind == "looks-wrong" for w in self.warnings)

    def to_dict(self) -> dict:
        """``valid``: one verdict with the terminal's: it parses and nothing looks wrong (issue 63: a script
        read ``valid: true`` for code the terminal called "looks wrong"); ``parses``: the parse alone."""
        return {"valid": (self.valid and not self.looks_wrong) if self.checked else None,
                "parses": self.valid if self.checked else None, "looks_wrong": self.looks_wrong if self.checked else None,
                "checked": self.checked, "language": self.language, "errors": [asdict(e) for e in self.errors],
                "warnings": [asdict(w) for w in self.warnings]}


def not_checked(language: str | None = None) -> SyntaxReport:
    """The report for a text codila has no grammar for: nothing claimed either way."""
    return SyntaxReport(False, language=language, checked=False)


@lru_cache(maxsize=16)
def _parser(grammar: str = "python"):
    from tree_sitter import Language, Parser

    if grammar == "python":
        import tree_sitter_python

        return Parser(Language(tree_sitter_python.language()))
    from tree_sitter_language_pack import get_parser

    return get_parser(grammar)


_TOP = frozenset(("module", "block", "ERROR", "program", "source_file", "translation_unit", "compilation_unit",
                  "statement_block", "compound_statement", "declaration_list", "chunk", "document", "stream"))


def _unexpected(node) -> str:
    """"unexpected `<the node's first line, shortened>` in <enclosing construct>" for an ERROR node."""
    text = (node.text or b"").decode("utf-8", "replace").strip().split("\n", 1)[0].strip()
    text = text if len(text) <= 30 else text[:29] + "…"
    what = f"unexpected `{text}`" if text else "unexpected end of input"
    parent = node.parent
    if parent is not None and parent.type not in _TOP:
        what += " in " + parent.type.replace("_", " ")
    return what


def _tree_sitter_issues(code: str, limit: int, grammar: str = "python") -> list[SyntaxIssue]:
    tree = _parser(grammar).parse(code.encode("utf-8"))
    issues: list[SyntaxIssue] = []
    stack = [tree.root_node]
    while stack and len(issues) < limit:
        node = stack.pop()
        if not node.has_error and not node.is_missing:
            continue
        line, col = node.start_point[0] + 1, node.start_point[1] + 1
        if node.is_missing:
            issues.append(SyntaxIssue(line, col, f"missing {node.type}", f"missing `{node.type}`"))
            continue
        if node.type == "ERROR":
            issues.append(SyntaxIssue(line, col, "error", _unexpected(node)))
            continue
        stack.extend(reversed(node.children))
    return sorted(issues, key=lambda i: (i.line, i.column))


def _line_of(code: str, offset: int) -> int:
    return code.count("\n", 0, max(0, offset)) + 1


def _findings(code: str, span: tuple[int, int] | None) -> tuple[Finding, ...]:
    """pyflakes' findings on code that parses, those inside ``span`` (whole lines) when given."""
    import ast

    try:
        from pyflakes.checker import Checker
    except ImportError:  # pyflakes is a dependency; a broken install reports no finding rather than failing
        return ()
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError):
        return ()
    first, last = (_line_of(code, span[0]), _line_of(code, span[1])) if span else (1, code.count("\n") + 1)
    out = []
    for m in sorted(Checker(tree, filename="<codila>").messages, key=lambda m: (m.lineno, m.col)):
        if first <= m.lineno <= last:
            kind = re.sub(r"(?<!^)(?=[A-Z])", "-", type(m).__name__).lower()
            out.append(Finding(m.lineno, m.col + 1, kind, m.message % m.message_args))
    return tuple(out)


def check_code(code: str, *, language: Any, limit: int = 20, span: tuple[int, int] | None = None) -> SyntaxReport:
    """The report for ``code`` in ``language`` (a languages.Language, or None when none is known)."""
    if language is None or language.grammar is None:
        return not_checked(language.name if language is not None else None)
    if language.python:
        return check_python(code, limit=limit, span=span)
    def issues(text: str) -> SyntaxReport:
        found = sorted(_tree_sitter_issues(text, limit, language.grammar), key=lambda i: (i.line, i.column))
        return SyntaxReport(not found, tuple(found), language=language.name)

    return _placed(code, issues(code), span, issues)


def _placed(code: str, report: SyntaxReport, span: tuple[int, int] | None, recheck: Any) -> SyntaxReport:
    """Each problem marked "given" when the user's text alone (``code`` without the generated ``span``,
    checked by ``recheck``) has a problem on the same line, else "generated" (issue 63: a parser blamed the
    user's untouched lines for an unclosed bracket the model wrote, or a valid TypeScript prompt for the
    Python the model wrote after it). The seam (the lines around the fill point) is the fill's: a prompt
    alone ends where its continuation is missing."""
    if span is None or not report.errors:
        return report
    first, last = _line_of(code, span[0]), _line_of(code, span[1])
    given = code[: span[0]] + code[span[1] :]
    added = code.count("\n", span[0], span[1])
    seam = _line_of(given, span[0])
    theirs = {e.line if e.line < seam else e.line + added for e in recheck(given).errors if e.line != seam}
    return replace(report, errors=tuple(
        replace(e, where="given" if e.line in theirs and not first <= e.line <= last else "generated")
        for e in report.errors))


def check_python(code: str, *, limit: int = 20, span: tuple[int, int] | None = None) -> SyntaxReport:
    """Whether ``code`` parses, every problem located, and (when it parses) pyflakes' findings;
    ``span``: the character offsets of the generated part (see the module docstring)."""
    report = _placed(code, _check(code, limit), span, lambda text: _check(text, limit))
    if report.valid:
        from codila_cli.checks import looks_wrong

        wrong = tuple(Finding(line, col, "looks-wrong", msg) for line, col, msg in looks_wrong(code, span=span))
        report = SyntaxReport(True, (), wrong + _findings(code, span))
    return report


def _check(code: str, limit: int) -> SyntaxReport:
    issues = _tree_sitter_issues(code, limit)
    try:
        with warnings.catch_warnings():  # SyntaxWarnings about the checked code are not codila's to print
            warnings.simplefilter("ignore")
            compile(code, "<codila>", "exec", dont_inherit=True)
    except SyntaxError as exc:  # IndentationError and TabError are SyntaxErrors
        line, col, msg = exc.lineno or 1, exc.offset or 1, exc.msg
        end = re.match(r"unterminated triple-quoted string literal \(detected at line (\d+)\)", msg)
        if end:  # the rest is string text that tree-sitter read as code: its "errors" there are noise
            issues = [i for i in issues if not line < i.line <= int(end.group(1))]
        same = [k for k, i in enumerate(issues) if i.line == line]
        if not same:
            issues.append(SyntaxIssue(line, col, f"python: {msg}", msg))
        elif msg != "invalid syntax":  # Python's specific words (and column) beat tree-sitter's guess
            k = same[0]
            issues[k] = SyntaxIssue(line, col, issues[k].kind, msg)
    except ValueError as exc:  # e.g. source contains null bytes
        issues.append(SyntaxIssue(1, 1, f"python: {exc}", str(exc)))
    return SyntaxReport(valid=not issues, errors=tuple(sorted(issues, key=lambda i: (i.line, i.column))))


def fence_language(text: str) -> Any:
    """The language (languages.Language) the fence :func:`extract_code` takes names (```ts), else None."""
    from codila_cli.languages import PYTHON, by_name

    blocks = FENCE.findall(text)
    if not blocks:
        return None
    if any(lang.lower() in ("python", "py", "python3") for lang, _ in blocks):
        return PYTHON
    return by_name(blocks[0][0]) if blocks[0][0] else None


def extract_code(text: str) -> str:
    """The code in a chat answer: the first ```python fence (else the first fence), else the text.

    An unterminated fence (generation stopped early) yields everything after it.
    """
    blocks = FENCE.findall(text)
    if not blocks:
        return text.strip("\n") + ("\n" if text.strip() else "")
    for lang, body in blocks:
        if lang.lower() in ("python", "py", "python3"):
            return body.rstrip() + "\n"
    return blocks[0][1].rstrip() + "\n"
