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
