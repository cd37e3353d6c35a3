"""``codila train align --marginals-cache DIR``: the DLM's top-k marginals of every scored block, kept
on disk, so that another alignment run over the same rows skips the DLM's forward (issue 24, item 7).

What is kept. Row r of step s (its window, its x_t and its scored blocks) depends only on the seed, the
data and the mask settings (trainer.py), so the marginals π_j of its scored positions depend only on
those and on the DLM. Per (step, row) the cache holds the k most likely shared ids of each scored
position and their probabilities renormalised over those k: ``[blocks, B, k]`` int32 indices into the
shared set S plus float16 probabilities, 6·k bytes a position. Entries live under ``DIR/<key>/``, where
``<key>`` hashes everything they depend on (``key.json`` lists it): the DLM's weights fingerprint and
dtype, the tokenised training stream, the shared-id set, the seed, ``--seq-len``, ``--block-sizes``,
``--blocks-per-row``, ``--frontier`` and k. One DIR serves any number of runs.

What it changes. With a cache the soft embedding is Σ_{top-k} π̂(v)·E_AR[v] in the run that writes the
entries as in every run that reads them, so a reading run gives the parameters of the writing run, and
k ≥ |S| is the uncached objective (tests/test_align.py). Runs that differ only in what the entries do not
depend on reuse them: the learning rate and its schedule, ``--steps`` (up to those written), ``--batch``
(rows 0 … b−1 of a step are the same rows), ``--grad-accum``, the number of processes, ``--context``,
``--context-share``, ``--weighting``, and the helper itself when its tokenizer is the same (a sweep, or
Qwen3-0.6B then Qwen3-1.7B against one Dream-Coder-7B). It gives no second epoch: rows never repeat
within a run (every step draws fresh windows and masks), which keeps the objective the paper's.

Integrity. Each entry carries the SHA-256 of its arrays; one that does not load, fails its checksum or
has another shape (a truncated write, a disk error, an edit) is removed and recomputed, never trained
on; the run's log counts them (``cache_damaged``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def stream_digest(path: Path) -> str:
    """SHA-256 of a tokenised stream file (``training/data/train.npy``), read in 16 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for piece in iter(lambda: fh.read(1 << 24), b""):
            h.update(piece)
    return h.hexdigest()


def cache_key(cfg: Any, pair: Any, *, dtype: str) -> dict:
    """Everything the cached marginals depend on (the DLM, the rows, their masks and blocks, k)."""
    from codila_cli.models.cache import fingerprint

    shared = pair.bridge.shared_ids.tolist()
    return {"dlm": fingerprint(pair.dlm_path) or str(pair.dlm_path.resolve()), "dlm_dtype": dtype,
            "train_stream": stream_digest(cfg.state_dir / "data" / "train.npy"), "shared_ids": _digest(shared),
            **({"helper_ids": _digest(pair.bridge.ar_ids.tolist())} if hasattr(pair.bridge, "ar_ids") else {}),
            "shared_count": len(shared), "bos": pair.dlm_specials.bos, "mask": pair.dlm_specials.mask,
            "seed": cfg.seed, "seq_len": cfg.seq_len, "block_sizes": list(cfg.block_sizes),
            "blocks_per_row": cfg.blocks_per_row, "frontier": cfg.frontier,
            "top_k": min(cfg.marginals_top_k, len(shared)), "format": 2}  # 2: entries carry a checksum


def _entry_digest(idx: np.ndarray, probs: np.ndarray) -> str:
    """SHA-256 of one entry's arrays (dtype, shape, bytes): a damaged or edited entry fails it."""
    h = hashlib.sha256()
    for a in (idx, probs):
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


class MarginalsCache:
    """Entries of one key under ``root/<key>/``: ``get`` and ``put`` per (step, row), atomically written."""

    def __init__(self, root: Path, key: dict, *, main: bool = True) -> None:
        self.k = int(key["top_k"])
        self.dir = root / _digest(key)[:20]
        self.misses = 0  # calls of get that found a row missing (trainer.py logs them as dlm_forwards)
        self.damaged = 0  # entries that failed to load or their checksum: removed and recomputed
        if main:
            self.dir.mkdir(parents=True, exist_ok=True)
            if not (self.dir / "key.json").is_file():
                tmp = self.dir / ".key.json.tmp"
                tmp.write_text(json.dumps(key, indent=2, sort_keys=True) + "\n", encoding="utf-8")
                os.replace(tmp, self.dir / "key.json")

    def _path(self, step: int, row: int) -> Path:
        return self.dir / f"{step // 1000:05d}" / f"{step:07d}-{row:05d}.npz"

    def get(self, step: int, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(idx [m, B, k] long, probs [m, B, k] float32) of the rows' scored blocks in the loss's order
        (row by row, block by block), or None when any row is missing or damaged. A damaged entry (it
        does not load, its checksum fails, or its shape is not this key's) is never used: it is
        removed, counted in ``damaged``, and the caller recomputes it."""
        parts = []
        for r in rows:
            path = self._path(step, r)
            entry = self._read(path) if path.is_file() else None
            if entry is None:
                self.misses += 1
                return None
            parts.append(entry)
        idx = torch.from_numpy(np.concatenate([p[0] for p in parts])).long()
        probs = torch.from_numpy(np.concatenate([p[1] for p in parts]).astype(np.float32))
        return idx, probs

    def _read(self, path: Path) -> tuple[np.ndarray, np.ndarray] | None:
        try:
            with np.load(path, allow_pickle=False) as z:
                idx, probs, check = z["idx"], z["probs"], str(z["sha256"])
            ok = (check == _entry_digest(idx, probs) and idx.ndim == 3 and idx.shape == probs.shape
                  and idx.shape[2] == self.k and idx.dtype == np.int32 and probs.dtype == np.float16)
        except Exception:  # noqa: BLE001 - a truncated zip, a missing array, a pickle: all mean damaged
            ok = False
        if ok:
            return idx, probs
        self.damaged += 1
        path.unlink(missing_ok=True)
        return None

    def put(self, step: int, rows: list[int], counts: list[int], idx: torch.Tensor, probs: torch.Tensor) -> None:
        """Store each row's slice (``counts``: its scored blocks) of the loss-ordered idx/probs."""
        i = 0
        for r, c in zip(rows, counts):
            path = self._path(step, r)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
            part_idx = idx[i : i + c].to(torch.int32).cpu().numpy()
            part_probs = probs[i : i + c].to(torch.float16).cpu().numpy()
            np.savez(tmp, idx=part_idx, probs=part_probs, sha256=np.array(_entry_digest(part_idx, part_probs)))
            os.replace(tmp, path)
            i += c
