"""Training checkpoints that carry their own checksum (issue 40, item 4).

A checkpoint is one ``torch.save`` dict (``model``, ``opt``, ``step``) plus ``"sha256"``: the digest of
every tensor's bytes, dtype and shape and every other value, in key order. It is written through a
temporary file and a rename (the old checkpoint or the new one, never half), and read back only if it
loads and its digest matches: a truncated file or one whose numbers were changed is refused with an
error that names the file, never trained on; so is one without its digest (removing the key would
otherwise let any change through: issue 53). :func:`deferred_interrupt` keeps Ctrl-C out of an optimizer update, so the checkpoint an
interrupted run writes is that of its last whole step and a resumed run continues it exactly.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
from pathlib import Path
from typing import Any

from codila_cli.errors import UsageError

KEY = "sha256"


def digest(obj: Any) -> str:
    """SHA-256 over a state dict's structure and contents (tensors by dtype, shape and bytes)."""
    import torch

    h = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(value, dict):
            h.update(b"{")
            for k in sorted(value, key=repr):
                h.update(repr(k).encode())
                feed(value[k])
            h.update(b"}")
        elif isinstance(value, (list, tuple)):
            h.update(b"[" if isinstance(value, list) else b"(")
            for v in value:
                feed(v)
            h.update(b"]")
        else:
            h.update(f"{type(value).__name__}:{value!r}".encode())

    feed(obj)
    return h.hexdigest()


def save_checkpoint(state: dict, path: Path) -> None:
    """``state`` with its digest, to ``path`` through a temporary file and a rename."""
    import torch

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save({**state, KEY: digest(state)}, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_checkpoint(path: Path, *, map_location: Any = "cpu") -> dict:
    """The checkpoint at ``path``, its digest checked; UsageError naming the file if it is damaged."""
    import torch

    hint = f"the file is damaged: delete {path} to start this stage over, or restore it from a copy"
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise UsageError(f"no checkpoint at {path}", hint="run without --resume to start the stage") from None
    except (RuntimeError, EOFError, ValueError, OSError, KeyError, pickle.UnpicklingError) as exc:  # a cut zip, junk
        raise UsageError(f"checkpoint {path} cannot be read ({_short(exc)}): truncated or not a checkpoint",
                         hint=hint) from None
    if not isinstance(state, dict):
        raise UsageError(f"checkpoint {path} is not a training checkpoint", hint=hint)
    want = state.pop(KEY, None)
    if want is None:
        raise UsageError(f"checkpoint {path} carries no checksum, so a change to it could not be seen",
                         hint=hint)
    if want != digest(state):
        raise UsageError(f"checkpoint {path} fails its checksum: its contents changed after it was written",
                         hint=hint)
    return state


@contextlib.contextmanager
def deferred_interrupt():
    """Hold Ctrl-C (SIGINT) back for the duration: an optimizer update and its step count happen
    together or not at all, so the checkpoint an interrupt writes is that of a whole step. Outside the
    main thread (where no handler can be set), and where SIGINT is ignored (a background job of a
    script, `codila train align … &`), it is a no-op: an ignored Ctrl-C stays ignored."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:120]
