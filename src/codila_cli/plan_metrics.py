"""SDDC metrics computed with tree-sitter on each decoded unit (the SDDC paper's Table 3).

* **Misbound**: share of canvases whose first definition (function or class name) belongs to another
  entry of the contract (it is in another entry's ``def`` and not in its own).
* **Overrun**: share of canvases that continue into a later unit: some definition after the first one
  belongs to a later entry's ``def``.
* **Defined**: whether every identifier the contract promises (all ``def`` lists) is defined at the top
  level of the assembled program (functions, classes, assignments).
"""

from __future__ import annotations

from codila_cli.contract import Contract


def definitions(code: str) -> list[str]:
    """Names defined by function/class definitions anywhere in ``code``, in source order."""
    from codila_cli.syntax import _parser

    tree = _parser().parse(code.encode("utf-8"))
    names: list[str] = []
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type in ("function_definition", "class_definition"):
            name = node.child_by_field_name("name")
            if name is not None:
                names.append((name.start_byte, name.text.decode("utf-8", "replace")))  # type: ignore[arg-type]
        stack.extend(reversed(node.children))
    return [n for _, n in sorted(names)]  # type: ignore[misc]


def top_level_names(code: str) -> set[str]:
    from codila_cli.syntax import _parser

    tree = _parser().parse(code.encode("utf-8"))
    out: set[str] = set()
    for node in tree.root_node.children:
        if node.type == "decorated_definition":
            node = node.child_by_field_name("definition") or node
        if node.type in ("function_definition", "class_definition"):
            name = node.child_by_field_name("name")
            if name is not None:
                out.add(name.text.decode("utf-8", "replace"))
                if node.type == "class_definition":  # methods count as defined names of the program
                    out.update(definitions(node.text.decode("utf-8", "replace"))[1:])
        elif node.type == "expression_statement" and node.children and node.children[0].type == "assignment":
            left = node.children[0].child_by_field_name("left")
            if left is not None and left.type == "identifier":
                out.add(left.text.decode("utf-8", "replace"))
    return out


def misbound_overrun(contract: Contract, units: list[str]) -> tuple[float, float]:
    mis = over = 0
    n = len(contract.entries)
    for e, code in zip(contract.entries, units):
        names = definitions(code)
        if not names:
            continue
        owner = contract.owner(names[0])
        if owner is not None and owner != e.index and names[0] not in e.defs:
            mis += 1
        if any((o := contract.owner(nm)) is not None and o > e.index and nm not in e.defs for nm in names[1:]):
            over += 1
    return (mis / n, over / n) if n else (0.0, 0.0)


def all_defined(contract: Contract, program: str) -> bool:
    promised = {d for e in contract.entries for d in e.defs}
    return promised <= top_level_names(program)
