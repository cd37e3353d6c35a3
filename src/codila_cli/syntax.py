"""Syntax report for generated Python, and code extraction from chat output.

``valid`` requires both tree-sitter (no ERROR / MISSING node) and Python's own parser
(``compile(..., "exec", dont_inherit=True)``): tree-sitter alone misses most indentation errors, and
it is tree-sitter that locates and names the problem. Lines and columns are 1-based.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from functools import lru_cache

FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


@dataclass(frozen=True)
class SyntaxIssue:
    line: int
    column: int
    kind: str  # "error" (tree-sitter ERROR node), "missing <token>", or "python: <message>"


@dataclass(frozen=True)
class SyntaxReport:
    valid: bool
    errors: tuple[SyntaxIssue, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return {"valid": self.valid, "errors": [asdict(e) for e in self.errors]}


@lru_cache(maxsize=1)
def _parser():
    import tree_sitter_python
    from tree_sitter import Language, Parser

    return Parser(Language(tree_sitter_python.language()))


def _tree_sitter_issues(code: str, limit: int) -> list[SyntaxIssue]:
    tree = _parser().parse(code.encode("utf-8"))
    issues: list[SyntaxIssue] = []
    stack = [tree.root_node]
    while stack and len(issues) < limit:
        node = stack.pop()
        if not node.has_error and not node.is_missing:
            continue
        if node.is_missing:
            issues.append(SyntaxIssue(node.start_point[0] + 1, node.start_point[1] + 1, f"missing {node.type}"))
            continue
        if node.type == "ERROR":
            issues.append(SyntaxIssue(node.start_point[0] + 1, node.start_point[1] + 1, "error"))
            continue
        stack.extend(reversed(node.children))
    return sorted(issues, key=lambda i: (i.line, i.column))


def check_python(code: str, *, limit: int = 20) -> SyntaxReport:
    issues = _tree_sitter_issues(code, limit)
    try:
        compile(code, "<codila>", "exec", dont_inherit=True)
    except SyntaxError as exc:  # IndentationError and TabError are SyntaxErrors
        line, col = exc.lineno or 1, exc.offset or 1
        if not any(i.line == line for i in issues):
            issues.append(SyntaxIssue(line, col, f"python: {exc.msg}"))
    except ValueError as exc:  # e.g. source contains null bytes
        issues.append(SyntaxIssue(1, 1, f"python: {exc}"))
    return SyntaxReport(valid=not issues, errors=tuple(sorted(issues, key=lambda i: (i.line, i.column))))


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
