"""The held-out prompt set: 120 signature + docstring prompts from code the bundled models never saw.

Built by ``train/corpus.py::heldout_prompts`` (validation-split files and packages outside the corpus,
round-robin over packages, no 20-token overlap with any training function) and shipped as package data.
``prompt + completion`` is checked for syntax; an empty completion counts as not valid, because a
signature + docstring alone already parses.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path


def load_heldout(path: Path | None = None) -> list[dict]:
    text = path.read_text(encoding="utf-8") if path else (
        resources.files("codila_cli") / "data" / "heldout_prompts.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]
