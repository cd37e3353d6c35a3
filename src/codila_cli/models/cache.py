"""Resolve models from the local Hugging Face cache only: loading never downloads (``codila pull`` does:
models/pull.py; a pull without a revision records the commit it got, and loads use it).

Environment variables are read at call time (HF_HUB_CACHE > HF_HOME/hub > XDG_CACHE_HOME/huggingface/hub
> ~/.cache/huggingface/hub), so a test or a user changing them in-process is honoured. This module
imports neither torch nor transformers: a missing model fails before any heavy import.
"""

from __future__ import annotations

import os
from pathlib import Path

from codila_cli.errors import ModelLoadError, ModelNotFoundError
from codila_cli.models.registry import ModelSpec

WEIGHT_PICKLE = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.pth", "model.ckpt")


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache directory as huggingface_hub would compute it from the environment."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.path.expanduser(os.environ["HF_HUB_CACHE"]))
    if os.environ.get("HF_HOME"):
        return Path(os.path.expanduser(os.environ["HF_HOME"])) / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "huggingface" / "hub"


def _download_hint(spec: ModelSpec) -> str:
    return f"codila pull {spec.name}"


def resolve_local_dirs(specs: list[ModelSpec | None]) -> list[Path | None]:
    """:func:`resolve_local_dir` for each spec (None stays None); when several are missing, one
    ModelNotFoundError names them all, each with its download command, so a user fixes them in one go."""
    out: list[Path | None] = []
    missing: list[ModelNotFoundError] = []
    for spec in specs:
        try:
            out.append(resolve_local_dir(spec) if spec is not None else None)
        except ModelNotFoundError as exc:
            missing.append(exc)
            out.append(None)
    if len(missing) == 1:
        raise missing[0]
    if missing:
        names = ", ".join(getattr(e, "what", e.message) for e in missing)
        hints = "; ".join(dict.fromkeys(e.hint for e in missing if e.hint))
        raise ModelNotFoundError(f"{len(missing)} models are not in the Hugging Face cache ({hf_cache_dir()}): {names}",
                                 hint=hints)
    return out


def resolve_local_dir(spec: ModelSpec) -> Path:
    """Return the directory holding the checkpoint, or raise ModelNotFoundError (exit 3)."""
    if spec.local_path is not None:
        path = spec.local_path
        if spec.bundled and not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"bundled model '{spec.name}' is not installed in this package ({path})",
                hint="reinstall codila, or train it with `codila train` (docs/training.md)",
            )
        _check_dir(path, spec)
        return path
    assert spec.repo_id is not None
    cache = hf_cache_dir()
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    from codila_cli.models.pull import recorded

    revision = spec.revision or recorded(cache, spec.repo_id)  # no revision named: the commit codila pull got
    try:
        folder = snapshot_download(
            spec.repo_id, revision=revision, cache_dir=str(cache), local_files_only=True
        )
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError) as exc:
        what = f"'{spec.name}' ({spec.repo_id}{'@' + spec.revision if spec.revision else ''})"
        hint = _download_hint(spec)
        repo_dir = cache / ("models--" + spec.repo_id.replace("/", "--")) / "snapshots"
        if spec.revision and repo_dir.is_dir() and any(repo_dir.iterdir()):
            hint += f" (the cache holds other revisions of it; `{spec.name.partition('@')[0]}@main` loads the newest)"
        err = ModelNotFoundError(f"model {what} is not in the Hugging Face cache ({cache})", hint=hint)
        err.what = what  # type: ignore[attr-defined]  (resolve_local_dirs names several at once)
        raise err from exc
    path = Path(folder)
    _check_dir(path, spec)
    return path


def _check_dir(path: Path, spec: ModelSpec) -> None:
    from codila_cli.models.files import check_folder

    if not os.path.lexists(path / "config.json"):
        raise ModelNotFoundError(
            f"'{spec.name}' has no config.json ({path})",
            hint=_download_hint(spec) if spec.repo_id else "point at a Hugging Face model directory",
        )
    check_folder(path, name=spec.name)  # every file a load opens is a regular file (a FIFO hangs a reader)
    if not any(path.glob("*.safetensors")):
        pickles = [n for n in WEIGHT_PICKLE if (path / n).exists()]
        if pickles:
            raise ModelLoadError(
                f"'{spec.name}' only has pickle weights ({pickles[0]}); codila loads safetensors only",
                hint="convert the checkpoint to safetensors (pickle files can execute code when loaded)",
            )
        raise ModelNotFoundError(
            f"'{spec.name}' has no *.safetensors weights ({path})",
            hint=_download_hint(spec) if spec.repo_id else "the directory needs model.safetensors",
        )


def fingerprint(path: Path) -> str | None:
    """A cheap content fingerprint of a checkpoint directory's weights: SHA-256 over each
    ``*.safetensors`` file's name, size and 17 evenly spaced 64 KiB samples (about 1 MiB read per file,
    however large), so a copied or moved checkpoint keeps its identity. None without weight files."""
    import hashlib

    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        size = f.stat().st_size
        h.update(f.name.encode() + size.to_bytes(8, "little"))
        with open(f, "rb") as fh:
            for k in range(17):
                fh.seek(size * k // 17)
                h.update(fh.read(65536))
    return h.hexdigest()


def identity(spec: ModelSpec, path: Path) -> dict:
    """How a trained helper records a model (``codila_training.dlm``): its spec, repository and the
    snapshot's commit when it came from the hub cache, the resolved directory, and the weights'
    :func:`fingerprint`."""
    revision = spec.revision
    if spec.repo_id and path.parent.name == "snapshots":
        revision = path.name
    return {"name": spec.name, "repo_id": spec.repo_id, "revision": revision, "path": str(path.resolve()),
            "fingerprint": fingerprint(path)}


def same_model(recorded: dict, current: dict) -> bool:
    """The same weights when both sides have a fingerprint (a copied or moved checkpoint is the same
    model), else the same repository (and revision, when both are known), else the same directory."""
    if recorded.get("fingerprint") and current.get("fingerprint"):
        return recorded["fingerprint"] == current["fingerprint"]
    if recorded.get("repo_id") and current.get("repo_id"):
        rev = recorded.get("revision")
        return recorded["repo_id"] == current["repo_id"] and (rev is None or rev == current.get("revision"))
    return recorded.get("path") == current.get("path")
