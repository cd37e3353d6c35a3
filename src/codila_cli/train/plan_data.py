"""Contract-formatted training programs for the bundled plan model (SDDC, docs/plan.md).

From real modules, by static analysis: windows of 2–4 consecutive top-level functions/classes become
entries (role function/class; ``def`` = the name; ``use`` = names defined by other units of the window
that this unit mentions; ``budget`` = its token count, snapped to the menu). The prompt is the first
docstring line of the module (or of the first unit), followed in three examples of four by the
names to define (:func:`plan_prompt`: ``# defines: a, b``), so the model learns to take its
contract's names from the prompt and still plans when none are given. Each example is laid out exactly as
``decoding/sddc.py::decode_plan`` lays out a run: prompt, ``# contract``, the contract template with
its values, then one canvas per unit (``# unit k`` marker + code stub + body + end-of-text padding).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

from codila_cli.contract import Contract, Entry
from codila_cli.decoding.plan_config import PlanConfig


@dataclass
class PlanExample:
    ids: list[int]
    maskable: list[int]  # positions the diffusion objective may mask (contract values and unit bodies)


def plan_prompt(summary: str, names: Iterable[str] = ()) -> str:
    """The prompt style `codila plan` is trained on: a one-line summary, then the names to define."""
    names = list(names)
    return f"{summary}\n# defines: {', '.join(names)}" if names else summary


def _units(text: str) -> tuple[str | None, list[tuple[str, str, str]]]:
    """(module docstring line, [(role, name, source)]) for top-level functions and classes."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None, []
    lines = text.splitlines(keepends=True)
    doc = ast.get_docstring(tree)
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.decorator_list:
            role = "class" if isinstance(node, ast.ClassDef) else "function"
            src = "".join(lines[node.lineno - 1 : node.end_lineno])
            if isinstance(node, ast.AsyncFunctionDef):
                continue
            d = ast.get_docstring(node)
            out.append((role, node.name, src, d.strip().splitlines()[0] if d else None))
    return (doc.strip().splitlines()[0] if doc else None), out  # type: ignore[return-value]


def build_examples(texts: Iterable[str], *, tokenizer, specials, vocab_rows: int, config: PlanConfig,
                   seq_len: int = 512, max_examples: int = 20000) -> list[PlanExample]:
    from codila_cli.decoding.sddc import ContractTemplate, _header

    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)
    tpl = ContractTemplate(tokenizer, specials, config, vocab_rows)
    examples: list[PlanExample] = []
    for text in texts:
        mod_doc, units = _units(text)
        for start in range(len(units) - 1):
            window = units[start : start + min(config.max_units, 2 + (start // 2) % 3)]
            if len(window) < 2:
                continue
            summary = mod_doc or window[0][3]
            if not summary:
                continue
            prompt = plan_prompt(summary, [u[1] for u in window] if start % 4 != 3 else ())
            names = {name for _, name, _, _ in window}
            entries, bodies = [], []
            ok = True
            for k, (role, name, src, _) in enumerate(window, 1):
                e0 = Entry(k, role, 1, (name,))
                stub = _header(e0)[1]
                if not src.startswith(stub) or len(enc(name)) > config.def_slots:
                    ok = False
                    break
                body = enc(src[len(stub) :].rstrip() + "\n")
                used = sorted(n for n in names - {name} if re.search(rf"\b{re.escape(n)}\b", src))
                use_text = ",".join(used)
                if len(enc(use_text)) > config.use_slots:
                    use_text = ""
                entries.append(Entry(k, role, max(1, min(len(body), 2048)), (name,), tuple(use_text.split(",")) if use_text else ()))
                bodies.append(body)
            if not ok:
                continue
            contract = Contract(tuple(entries))
            head = [specials.bos] + enc(prompt) + enc("\n# contract\n")
            c_ids, slots = tpl.layout(tpl.values_of(contract))
            ids = head + c_ids
            maskable = [len(head) + s.pos for s in slots]
            for e, body in zip(entries, bodies):
                marker, stub = _header(e)
                n = max(config.min_canvas, math.ceil(config.pad_scale * e.budget))
                if len(body) > n:
                    ok = False
                    break
                fixed = enc(marker) + enc(stub)
                start_body = len(ids) + len(fixed)
                ids += fixed + body + [specials.eos] * (n - len(body))
                maskable += list(range(start_body, start_body + n))
            if not ok or len(ids) > seq_len:
                continue
            examples.append(PlanExample(ids, maskable))
            if len(examples) >= max_examples:
                return examples
    return examples
