"""The shipped prompt sets: signature + docstring prompts from code the bundled models never saw.

``heldout_prompts.jsonl`` (120, session 3) is described below; ``dev_ext_prompts.jsonl`` (80) and
``heldout_ext_prompts.jsonl`` (120) come only from packages outside the corpus (issue 26,
scripts/make_prompt_sets.py).

Built by ``train/prompt_sets.py::heldout_prompts`` (validation-split files and packages outside the corpus,
round-robin over packages, no 20-token overlap with any training function) and shipped as package data.
``prompt + completion`` is checked for syntax; an empty completion counts as not valid, because a
signature + docstring alone already parses.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path


def load_heldout(path: Path | None = None, *, name: str = "heldout_prompts.jsonl") -> list[dict]:
    """A prompt set: ``path``, or the package data file ``name`` (heldout, dev_ext or heldout_ext)."""
    text = path.read_text(encoding="utf-8") if path else (
        resources.files("codila_cli") / "data" / name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]
