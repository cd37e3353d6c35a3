"""``codila pull``: a checkpoint into the standard Hugging Face cache, with ``huggingface_hub`` (issue 64).

Only the files codila loads are fetched (:func:`wanted`): config, generation config, tokenizer and chat
template files, safetensors weights and their index; never pickles or remote code. Before the first byte,
from the hub's API (through huggingface_hub): the commit the revision resolves to, every file's size and
checksum (the hub's sha256 for an LFS file, the git blob id for the others), and the free disk. Then each
file, ``config.json`` last, so a snapshot that has a ``config.json`` is complete and verified. The
downloads are codila's own, into the cache's layout (``blobs/<etag>``, linked from
``snapshots/<commit>/``): huggingface_hub 2.x deletes a partial file when its download fails, so an
interrupted pull could not resume. Each file grows in ``blobs/<etag>.incomplete``, which outlives an
interrupted pull; every request asks for the bytes from its size on (an HTTP range), and the whole file
is verified before it is renamed into place (a mismatch removes it and fails the pull). The resolved
commit is recorded in the cache (``refs/codila``) when the user named no revision, and later loads use
it (models/cache.py). Each file is fetched under the cache's own lock (``.locks/…/<etag>.lock``, the
one huggingface_hub takes), so two pulls of one model never write the same partial file.

Nothing here prints: progress goes to ``on_event`` (the command draws it).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from codila_cli.errors import CodilaError, ModelLoadError, UsageError
from codila_cli.models.registry import ModelSpec

NAMES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
         "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja",
         "chat_template.json", "model.safetensors.index.json")
RECORD = "codila"  # the cache ref (refs/codila) that records the commit a pull without a revision got
MARGIN = 64 * 2**20  # bytes kept free beyond what the files need


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int
    sha256: str | None  # an LFS file's
    blob_id: str | None  # git's object id (for a file stored in git itself)


@dataclass(frozen=True)
class PullPlan:
    spec: ModelSpec
    commit: str
    files: tuple[RemoteFile, ...]  # config.json last
    cache_dir: Path

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class PullEvent:
    kind: str  # "file" (a file starts), "bytes" (``done`` more bytes of it), "verified", "cached" (already here)
    file: str
    size: int = 0
    done: int = 0


def wanted(name: str) -> bool:
    """Whether codila loads a repository file of this name (top level only)."""
    return "/" not in name and (name in NAMES or name.endswith(".safetensors"))


def plan(spec: ModelSpec, *, cache_dir: Path, token: str | None = None) -> PullPlan:
    """The commit ``spec``'s revision resolves to and the files to fetch, from the hub's API."""
    from huggingface_hub import HfApi

    if spec.repo_id is None:
        raise UsageError(f"'{spec.name}' is not a Hugging Face repository", hint="pull an alias or an ORG/NAME repo id")
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise UsageError("HF_HUB_OFFLINE is set: codila pull needs the hub", hint="unset HF_HUB_OFFLINE for the pull")
    try:
        info = HfApi(endpoint=_endpoint(), token=token).model_info(spec.repo_id, revision=spec.revision or "main",
                                                                   files_metadata=True)
    except Exception as exc:  # noqa: BLE001 - every hub failure becomes one line (_hub_error)
        raise _hub_error(exc, spec) from None
    files = []
    for s in info.siblings or ():
        if not wanted(s.rfilename):
            continue
        lfs = s.lfs
        files.append(RemoteFile(s.rfilename, int(s.size or (lfs.size if lfs else 0) or 0),
                                lfs.sha256 if lfs else None, None if lfs else s.blob_id))
    if not any(f.name == "config.json" for f in files) or not any(f.name.endswith(".safetensors") for f in files):
        raise ModelLoadError(f"'{spec.name}' ({spec.repo_id}) has no config.json and safetensors weights to pull",
                             hint="codila loads Hugging Face checkpoints with safetensors weights")
    files.sort(key=lambda f: (f.name == "config.json", f.name))  # config.json last: its presence means complete
    return PullPlan(spec, str(info.sha), tuple(files), cache_dir)


def pull(p: PullPlan, *, token: str | None = None, on_event: Callable[[PullEvent], None] = lambda e: None) -> Path:
    """Fetch ``p``'s files into the cache, each verified, config.json last; the snapshot directory."""
    repo = p.cache_dir / _repo_folder(p.spec.repo_id)
    need = sum(f.size for f in p.files if not _cached(p, f)) - _partial_bytes(p)
    p.cache_dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(p.cache_dir).free
    if need + MARGIN > free:
        raise ModelLoadError(f"pulling '{p.spec.name}' needs {_gb(need)} more on the disk of {p.cache_dir}, and it has "
                             f"{_gb(free)} free", hint="free some space, or point HF_HOME at a larger disk")
    snapshot = repo / "snapshots" / p.commit
    for f in p.files:
        if _cached(p, f):
            on_event(PullEvent("cached", f.name, f.size))
            continue
        on_event(PullEvent("file", f.name, f.size))
        etag = f.sha256 or f.blob_id or f"{p.commit}-{f.name}"
        blob = repo / "blobs" / etag
        lock = p.cache_dir / ".locks" / _repo_folder(p.spec.repo_id) / f"{etag}.lock"  # huggingface_hub's own
        lock.parent.mkdir(parents=True, exist_ok=True)
        from filelock import FileLock

        with FileLock(str(lock)):  # another pull (codila's or hf's) of the same file waits, then finds it
            if not blob.is_file():
                try:
                    _download(p, f, blob, token=token, on_event=on_event)
                except Exception as exc:  # noqa: BLE001 - hub and network failures: one line each (Ctrl-C passes)
                    raise _hub_error(exc, p.spec) from None
        link = snapshot / f.name
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp = link.with_name(f".{f.name}.link")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(os.path.relpath(blob, link.parent))  # the cache's own layout: snapshot links to blobs
        os.replace(tmp, link)
        on_event(PullEvent("verified", f.name, f.size))
    if p.spec.revision is None:  # record the commit this pull got: later loads of the name use it
        ref = repo / "refs" / RECORD
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp = ref.with_name(f".{RECORD}.tmp")
        tmp.write_text(p.commit)
        os.replace(tmp, ref)
    return snapshot


def _download(p: PullPlan, f: RemoteFile, blob: Path, *, token: str | None,
              on_event: Callable[[PullEvent], None], attempts: int = 5) -> None:
    """``f`` into ``blob`` through ``blob.incomplete``, which survives an interrupted pull: each request
    asks for the bytes from its size on (an HTTP range), a dropped connection is retried from there, and
    the whole file is verified before it is renamed into place."""
    import time

    import httpx
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    part = blob.with_name(blob.name + ".incomplete")
    part.parent.mkdir(parents=True, exist_ok=True)
    url = hf_hub_url(p.spec.repo_id, f.name, revision=p.commit, endpoint=_endpoint())
    have = part.stat().st_size if part.is_file() else 0
    if have > f.size:
        part.unlink()
        have = 0
    if have:
        on_event(PullEvent("bytes", f.name, done=have))
    for attempt in range(attempts):
        headers = build_hf_headers(token=token, library_name="codila")
        if have:
            headers["Range"] = f"bytes={have}-"
        try:
            with httpx.stream("GET", url, headers=headers, follow_redirects=True, timeout=60) as r:
                if r.status_code >= 400:
                    from huggingface_hub.utils import hf_raise_for_status

                    r.read()
                    hf_raise_for_status(r)
                mode = "ab" if have and r.status_code == 206 else "wb"  # a server that ignores ranges: from 0
                if mode == "wb" and have:
                    on_event(PullEvent("bytes", f.name, done=-have))
                    have = 0
                with open(part, mode) as fh:
                    for chunk in r.iter_bytes(1 << 20):
                        fh.write(chunk)
                        fh.flush()
                        have += len(chunk)
                        on_event(PullEvent("bytes", f.name, done=len(chunk)))
            if have >= f.size:
                break
        except (httpx.TransportError, httpx.StreamError):
            if attempt == attempts - 1:
                raise
            time.sleep(min(2.0, 0.25 * (attempt + 1)))
        except OSError as exc:
            if exc.errno == 28:  # ENOSPC: what came so far is kept for the next pull
                raise ModelLoadError(f"the disk of {p.cache_dir} filled up while pulling {f.name}",
                                     hint="free some space and run the same codila pull again: it resumes") from None
            raise
    _verify(part, f, p.spec)
    os.replace(part, blob)


def recorded(cache_dir: Path, repo_id: str) -> str | None:
    """The commit a pull without a revision recorded for ``repo_id`` (None: none recorded)."""
    try:
        text = (cache_dir / _repo_folder(repo_id) / "refs" / RECORD).read_text().strip()
    except OSError:
        return None
    return text if len(text) == 40 and all(c in "0123456789abcdef" for c in text) else None


def _repo_folder(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def _cached(p: PullPlan, f: RemoteFile) -> bool:
    """Already in this commit's snapshot (verified when it was pulled)."""
    return (p.cache_dir / _repo_folder(p.spec.repo_id) / "snapshots" / p.commit / f.name).is_file()


def _partial_bytes(p: PullPlan) -> int:
    blobs = p.cache_dir / _repo_folder(p.spec.repo_id) / "blobs"
    try:
        return sum(b.stat().st_size for b in blobs.glob("*.incomplete"))
    except OSError:
        return 0


def _verify(path: Path, f: RemoteFile, spec: ModelSpec) -> None:
    """The file's sha256 (LFS) or git blob id against the hub's; a mismatch removes it and fails."""
    if f.sha256 is None and f.blob_id is None:
        return
    if f.sha256 is not None:
        h = hashlib.sha256()
    else:
        h = hashlib.sha1(usedforsecurity=False)
        h.update(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    want = f.sha256 or f.blob_id
    if h.hexdigest() != want:
        path.unlink(missing_ok=True)
        raise ModelLoadError(f"'{spec.name}': {f.name} does not match the hub's checksum (got {h.hexdigest()[:12]}…, "
                             f"expected {want[:12]}…); it was removed", hint="run the same codila pull again")


def _gb(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _hub_error(exc: BaseException, spec: ModelSpec) -> CodilaError:
    """One line for what the hub or the network said."""
    from huggingface_hub import errors

    page = f"https://huggingface.co/{spec.repo_id}"
    if isinstance(exc, CodilaError):
        return exc
    if isinstance(exc, errors.GatedRepoError):
        return ModelLoadError(f"'{spec.name}' ({spec.repo_id}) is gated: accept its licence at {page}",
                              hint="then give a token of that account in HF_TOKEN (huggingface.co/settings/tokens)")
    if isinstance(exc, errors.RevisionNotFoundError):
        return ModelLoadError(f"'{spec.name}': {spec.repo_id} has no revision {spec.revision!r}",
                              hint=f"see the commits at {page}/commits/main")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return ModelLoadError(f"'{spec.name}': {spec.repo_id} does not exist, or it is private and HF_TOKEN gives "
                              "no access to it", hint=f"check the name at {page}, or set HF_TOKEN")
    if isinstance(exc, errors.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        return ModelLoadError(f"the hub answered {status or 'an error'} for '{spec.name}' ({spec.repo_id})",
                              hint="try again later; HF_ENDPOINT names the hub codila asks")
    return ModelLoadError(f"cannot reach the hub for '{spec.name}' ({type(exc).__name__}: {str(exc)[:160]})",
                          hint="check the network (HF_ENDPOINT names the hub), then run the same codila pull again")
