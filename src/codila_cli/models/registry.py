"""Built-in model aliases and the bundled model pair.

An alias maps to a Hugging Face repository (and, where known, a pinned revision). A model argument
may also be a repository id (``org/name``) or a local directory in the Hugging Face layout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

Kind = Literal["dlm", "ar", "infill", "plan"]


@dataclass(frozen=True)
class ModelSpec:
    """What a model argument refers to before anything is loaded."""

    name: str  # alias, repo id or path as the user typed it
    kind: Kind
    repo_id: str | None = None  # None for local directories and bundled models
    revision: str | None = None
    local_path: Path | None = None
    bundled: bool = False


# Pinned revisions (Hugging Face commit shas of the snapshots codila was written against): an alias
# loads exactly that snapshot from the cache, never whatever `refs/main` points to today. A user opts out
# per call with `ALIAS@REVISION` (e.g. `dream-coder@main`) or names any repo as `ORG/NAME@REVISION`.
ALIASES: dict[str, ModelSpec] = {
    "dream-coder": ModelSpec("dream-coder", "dlm", repo_id="Dream-org/Dream-Coder-v0-Instruct-7B",
                             revision="5d9e88c723af9045f362748b5284bdf43d9c501e"),
    "dreamon": ModelSpec("dreamon", "infill", repo_id="Dream-org/DreamOn-v0-7B",
                         revision="8ccc74750e43177327f29dab9e91882ba759e194"),
    "qwen3-0.6b": ModelSpec("qwen3-0.6b", "ar", repo_id="Qwen/Qwen3-0.6B",
                            revision="c1899de289a04d12100db370d81485cdf75e47ca"),
    # LLaDA (models/llada.py): snapshots named by public scripts that load them (docs/models.md)
    "llada-8b-instruct": ModelSpec("llada-8b-instruct", "dlm", repo_id="GSAI-ML/LLaDA-8B-Instruct",
                                   revision="08b83a6feb34df1a6011b80c3c00c7563e963b07"),
    "llada-8b-base": ModelSpec("llada-8b-base", "dlm", repo_id="GSAI-ML/LLaDA-8B-Base",
                               revision="0f2787f2d87eac5eed8a087d5ecd24277e6255b2"),
    "llada-1.5": ModelSpec("llada-1.5", "dlm", repo_id="GSAI-ML/LLaDA-1.5",
                           revision="43716255dd5ce01192bcfc073a2557e969a2f271"),
    "sdar-8b": ModelSpec("sdar-8b", "dlm", repo_id="JetLM/SDAR-8B-Chat",  # block diffusion (models/sdar.py)
                         revision="ac4528d2c076b04e02a03e6f430efa4385331ce8"),
    # no public page names a full commit of it: `codila pull` resolves main, records the commit it got in
    # the cache (refs/codila), and every later load uses that commit (models/pull.py)
    "sdar-1.7b": ModelSpec("sdar-1.7b", "dlm", repo_id="JetLM/SDAR-1.7B-Chat"),
    "stable-diffcoder-8b": ModelSpec("stable-diffcoder-8b", "dlm",  # likewise (models/stable_diffcoder.py)
                                     repo_id="ByteDance-Seed/Stable-DiffCoder-8B-Instruct"),
}
RECORDED_AT_PULL = frozenset({"sdar-1.7b", "stable-diffcoder-8b"})  # aliases whose revision is the one `codila pull` recorded
# each alias's family (models/families.py; "ar" for a helper) and licence, as its model card states it
ALIAS_CARDS: dict[str, tuple[str, str]] = {
    "dream-coder": ("dream", "Apache-2.0"), "dreamon": ("dream", "Apache-2.0"), "qwen3-0.6b": ("ar", "Apache-2.0"),
    "llada-8b-instruct": ("llada", "MIT"), "llada-8b-base": ("llada", "MIT"), "llada-1.5": ("llada", "MIT"),
    "sdar-8b": ("sdar", "Apache-2.0"), "sdar-1.7b": ("sdar", "Apache-2.0"), "stable-diffcoder-8b": ("stable-diffcoder", "MIT"),
}

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "bundled"
BUNDLED: dict[str, tuple[Kind, str]] = {
    "bundled-dlm": ("dlm", "dlm"),
    "bundled-ar": ("ar", "ar"),
    "bundled-infill": ("infill", "tasks"),  # one multi-task fine-tune serves infill and plan (size cap)
    "bundled-plan": ("plan", "tasks"),
}


def bundled_path(alias: str) -> Path:
    return BUNDLED_DIR / BUNDLED[alias][1]


def bundled_available(alias: str) -> bool:
    return (bundled_path(alias) / "config.json").is_file()


def resolve_spec(name: str, *, kind: Kind) -> ModelSpec:
    """Turn a user's model argument into a ModelSpec, without touching the network or torch."""
    from codila_cli.errors import UsageError

    text = name.strip()
    if not text:
        raise UsageError("empty model name", hint="use an alias (see `codila models`), a repo id or a directory")
    if text in ALIASES:
        return ALIASES[text]
    base, at, rev = text.partition("@")
    if at and base in ALIASES:
        if not rev:
            raise UsageError(f"'{text}' names no revision", hint=f"use {base}@main or {base}@<commit sha>")
        return replace(ALIASES[base], name=text, revision=rev)
    if text in BUNDLED:
        return ModelSpec(text, BUNDLED[text][0], local_path=bundled_path(text), bundled=True)
    expanded = Path(os.path.expanduser(text))
    if expanded.is_dir():
        return ModelSpec(text, kind, local_path=expanded.resolve())
    looks_like_path = text.startswith((".", "/", "~")) or os.sep in text.replace("/", "", 1)
    repo, _, revision = text.partition("@")
    if not looks_like_path and repo.count("/") == 1 and all(repo.split("/")):
        return ModelSpec(text, kind, repo_id=repo, revision=revision or None)
    if looks_like_path or expanded.exists():
        from codila_cli.errors import ModelNotFoundError

        raise ModelNotFoundError(
            f"model directory '{text}' does not exist or is not a directory",
            hint="pass a directory with config.json and *.safetensors, an alias or a repo id",
        )
    close = [a for a in (*ALIASES, *BUNDLED) if a.startswith(text[:3].lower())]
    raise UsageError(
        f"unknown model '{text}'",
        hint=(f"did you mean {', '.join(close)}? " if close else "")
        + "use an alias from `codila models`, an ORG/NAME repo id or a local directory",
    )


def default_plan_dlm() -> str:
    """``codila plan`` without --dlm: the bundled plan model, else the bundled DLM."""
    from codila_cli.errors import ModelNotFoundError

    name = next((n for n in ("bundled-plan", "bundled-dlm") if bundled_available(n)), None)
    if name is None:
        raise ModelNotFoundError("no plan model given and no bundled model is installed", hint="pass --dlm")
    return name
