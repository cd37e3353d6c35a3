"""The prompt sets codila's quality numbers are measured on (src/codila_cli/data/*_prompts.jsonl):
documented functions of the validation split and of packages outside the corpus, cut after their
docstring, none sharing a 20-token window with a training function (scripts/make_prompt_sets.py)."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

from codila_cli.train.corpus import Decontaminator, collect_sources, functions_of, read_jsonl

HELDOUT_PACKAGES: dict[str, tuple[str, ...]] = {
    "pytest": ("_pytest",), "pip": ("pip",), "setuptools": ("setuptools",), "sympy": ("sympy",),
    "numpy": ("numpy",), "pygments": ("pygments",), "pyyaml": ("yaml",), "anyio": ("anyio",), "tqdm": ("tqdm",),
}


def _prompt_of(text: str, max_prompt_chars: int) -> tuple[str, str] | None:
    try:
        node = ast.parse(text).body[0]
    except (SyntaxError, IndexError, ValueError):
        return None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not ast.get_docstring(node):
        return None
    doc = node.body[0]
    if not (2 <= node.end_lineno - doc.end_lineno <= 25) or len(node.body) < 2:
        return None
    lines = text.splitlines(keepends=True)
    prompt = "".join(lines[: doc.end_lineno])
    if len(prompt) > max_prompt_chars:
        return None
    return prompt, "".join(lines[doc.end_lineno :])


def _pick(cands: list[tuple[str, str, str]], seen_train: Decontaminator | None, *, n: int, prefix: str,
          max_prompt_chars: int, per_file: int) -> list[dict]:
    """Deterministic choice of signature + docstring prompts: candidates sorted by a hash of their text,
    at most ``per_file`` per file, none sharing a 20-token window with a training function, round-robin
    over origins so no package dominates."""
    cands = sorted(cands, key=lambda c: hashlib.sha256(c[2].encode()).hexdigest())
    by_origin: dict[str, list[tuple[str, tuple[str, str]]]] = {}
    count: dict[str, int] = {}
    for origin, path, text in cands:  # eligible prompts per origin, in hash order
        got = _prompt_of(text, max_prompt_chars)
        if got is None or count.get(path, 0) >= per_file:
            continue
        if seen_train is not None and seen_train.contaminated(text):
            continue
        count[path] = count.get(path, 0) + 1
        by_origin.setdefault(origin, []).append((path, got))
    picked: list[dict] = []
    queues = {o: list(v) for o, v in sorted(by_origin.items())}
    while len(picked) < n and any(queues.values()):
        for origin, queue in queues.items():
            if queue and len(picked) < n:
                path, (prompt, ref) = queue.pop(0)
                picked.append({"id": f"{prefix}/{len(picked)}", "origin": origin, "path": path,
                               "prompt": prompt, "reference": ref})
    return picked


def _train_functions(train_jsonl: Path | None) -> Decontaminator | None:
    if train_jsonl is None:
        return None
    return Decontaminator(r["text"] for r in read_jsonl(train_jsonl) if r["kind"] == "function")


def heldout_prompts(valid_jsonl: Path, train_jsonl: Path | None = None, *, n: int = 120,
                    max_prompt_chars: int = 600, per_file: int = 3) -> list[dict]:
    """The session-3 held-out set (``heldout``): functions of the validation split and of
    HELDOUT_PACKAGES (read from the running interpreter), with a docstring and a 2–25 line body."""
    cands = [(r["origin"], r["path"], r["text"]) for r in read_jsonl(valid_jsonl) if r["kind"] == "function"]
    files, _ = collect_sources(HELDOUT_PACKAGES)
    for f in files:
        if f.origin != "stdlib":
            cands += [(f.origin, f.relpath, fn) for fn in functions_of(f.text)]
    return _pick(cands, _train_functions(train_jsonl), n=n, prefix="heldout", max_prompt_chars=max_prompt_chars,
                 per_file=per_file)


def package_prompts(packages: dict[str, tuple[str, ...]], *, site: Path | None, train_jsonl: Path | None,
                    n: int, prefix: str, max_prompt_chars: int = 1000, per_file: int = 30) -> list[dict]:
    """Prompts from packages that are not in the corpus (DEV_PACKAGES for ``dev-ext``, EXTERNAL_PACKAGES
    for ``heldout-ext``, issue 26): no validation-split code, only other people's packages."""
    files, _ = collect_sources(packages, site, stdlib=False)
    cands = [(f.origin, f.relpath, fn) for f in files for fn in functions_of(f.text)]
    return _pick(cands, _train_functions(train_jsonl), n=n, prefix=prefix, max_prompt_chars=max_prompt_chars,
                 per_file=per_file)
