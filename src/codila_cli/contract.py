"""SDDC contracts: one line per unit, a strict parser, and a fallback that never crashes.

Format (docs/plan.md)::

    @unit 1 role=function budget=64 def=parse_args use=
    @unit 2 role=function budget=96 def=main use=parse_args
    @end

* ``@unit`` lines are numbered 1, 2, 3… in order; ``role`` ∈ {function, class, method, helper, main};
  ``budget`` is the unit's token length (1–2048); ``def`` / ``use`` are comma-separated Python
  identifiers (possibly empty). ``@end`` closes the contract; blank lines and ``#`` comments are allowed.
* :func:`parse_contract` raises :class:`ContractError` (and nothing else) on any deviation.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field
from pathlib import Path

from codila_cli.errors import UsageError

ROLES = ("function", "class", "method", "helper", "main")
MAX_BUDGET = 2048
LINE = re.compile(r"@unit\s+(\d+)\s+role=(\S*)\s+budget=(\S*)\s+def=(\S*)\s+use=(\S*)")


class ContractError(UsageError):
    """The contract text does not follow the format."""


@dataclass(frozen=True)
class Entry:
    index: int
    role: str
    budget: int
    defs: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()

    def line(self) -> str:
        return f"@unit {self.index} role={self.role} budget={self.budget} def={','.join(self.defs)} use={','.join(self.uses)}"


@dataclass(frozen=True)
class Contract:
    entries: tuple[Entry, ...] = field(default_factory=tuple)

    def text(self) -> str:
        return "".join(e.line() + "\n" for e in self.entries) + "@end\n"

    def owner(self, name: str) -> int | None:
        """Index of the entry that defines ``name`` (first one), else None."""
        return next((e.index for e in self.entries if name in e.defs), None)


def is_identifier(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name)


def _names(text: str, what: str, lineno: int) -> tuple[str, ...]:
    if text == "":
        return ()
    names = tuple(text.split(","))
    for n in names:
        if not is_identifier(n):
            raise ContractError(f"contract line {lineno}: {what} {n!r} is not a Python identifier")
    return names


def parse_contract(text: str) -> Contract:
    if not isinstance(text, str):
        raise ContractError("contract must be text")
    entries: list[Entry] = []
    ended = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if ended:
            raise ContractError(f"contract line {lineno}: text after @end")
        if line == "@end":
            ended = True
            continue
        m = LINE.fullmatch(line)
        if not m:
            raise ContractError(f"contract line {lineno}: expected '@unit N role=R budget=B def=… use=…' or '@end'")
        index, role, budget = int(m.group(1)), m.group(2), m.group(3)
        if index != len(entries) + 1:
            raise ContractError(f"contract line {lineno}: unit {index} out of order (expected {len(entries) + 1})")
        if role not in ROLES:
            raise ContractError(f"contract line {lineno}: role {role!r} is not one of {', '.join(ROLES)}")
        if not budget.isdigit() or not (1 <= int(budget) <= MAX_BUDGET):
            raise ContractError(f"contract line {lineno}: budget must be an integer in 1..{MAX_BUDGET}")
        defs = _names(m.group(4), "def", lineno)
        if role in ("function", "class", "method", "helper") and not defs:
            raise ContractError(f"contract line {lineno}: a {role} unit must define at least one name")
        entries.append(Entry(index, role, int(budget), defs, _names(m.group(5), "use", lineno)))
    if not ended:
        raise ContractError("contract has no @end line")
    if not entries:
        raise ContractError("contract has no @unit entries")
    return Contract(tuple(entries))


def single_unit(budget: int) -> Contract:
    """The fallback plan: one main unit that writes everything."""
    return Contract((Entry(1, "main", max(1, min(budget, MAX_BUDGET))),))


def read_contract(path: Path) -> Contract:
    """``codila plan --contract FILE``: the file's contract; errors name the file."""
    from codila_cli.user_input import read_text

    text = read_text(path, what="--contract", kind="contract")
    try:
        return parse_contract(text)
    except ContractError as exc:
        raise ContractError(f"{path}: {exc.message}", hint="one line per unit, "
                            "`@unit N role=R budget=B def=a,b use=c`, then `@end` (docs/plan.md)") from None


def parse_commit(commit: str) -> float | None:
    """``--commit``: 'single' is None (one token per canvas per iteration), else the threshold γ_u."""
    if commit == "single":
        return None
    try:
        return float(commit)
    except ValueError:
        raise UsageError(f"--commit {commit!r} is neither 'single' nor a number",
                         hint="e.g. --commit single or --commit 4") from None


def parse_defines(defines: str | None) -> tuple[str, ...]:
    """``--defines a,b``: the unit names, in order (PlanConfig validates each)."""
    return tuple(n.strip() for n in defines.split(",")) if defines is not None else ()


def prompt_defines(prompt: str) -> str | None:
    """The names of a ``# defines: a, b`` line in a plan prompt (the form the bundled plan model was
    trained on, docs/plan.md), as ``--defines`` takes them; None when the prompt has no such line."""
    import re

    m = re.search(r"^[ \t]*#[ \t]*defines:[ \t]*(.+?)[ \t]*$", prompt, re.MULTILINE)
    return m.group(1) if m else None
