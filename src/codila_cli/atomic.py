"""Write a file whole or not at all: a temporary file beside the target, then ``os.replace``."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_bytes_atomic(target: Path, data: bytes) -> None:
    """``target`` holds ``data`` afterwards, or (on any error or interrupt) is as it was before."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(target: Path, text: str) -> None:
    write_bytes_atomic(target, text.encode("utf-8"))


def creatable_dir_problem(path: Path) -> str | None:
    """Why the directory ``path`` could not be created and written, or None if it can (it exists and is
    writable, or its nearest existing ancestor is). Nothing is created: a run that is refused later
    (a missing model, no jail) leaves no empty directory behind."""
    probe = path
    while not os.path.lexists(probe) and probe.parent != probe:
        probe = probe.parent
    if probe is not path and not probe.is_dir():
        return f"{probe} is not a directory"
    if probe is path and not path.is_dir():
        return "it exists and is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return None
