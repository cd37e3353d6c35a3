"""What codila opens from a model folder, checked before it is opened (issue 60): every file must be a
regular file (a FIFO named ``model.safetensors`` hung ``gen`` and ``serve`` for ever, past SIGINT and
SIGTERM, blocked in ``open``; ``/dev/zero`` as ``config.json`` was read without end), JSON files are
read with a size cap and a depth that cannot crash the parser, and each failure is one
:class:`ModelLoadError` naming the folder and the file (exit 1: the checkpoint is wrong, not codila).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from codila_cli.errors import ModelLoadError

# the files a load reads: configs, tokenizers, chat templates, weights (a model folder's README or
# pictures are never opened, so whatever they are is left alone)
OPENED_SUFFIXES = (".json", ".safetensors", ".txt", ".model", ".jinja", ".tiktoken")
JSON_LIMIT = 64 * 2**20  # bytes: a tokenizer.json of a 256k vocabulary is about 30 MB


def _kind(mode: int) -> str:
    for test, word in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return word
    return "not a regular file"


def check_folder(path: Path, *, name: str) -> None:
    """Refuse a model folder holding a file codila would open that is not a regular file (links are
    followed, as the Hugging Face cache links its snapshots to blobs); a broken link is named too."""
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except OSError as exc:
        raise ModelLoadError(f"'{name}': cannot list {path}: {exc.strerror}", hint="check the folder's permissions") from None
    for entry in entries:
        if not entry.name.endswith(OPENED_SUFFIXES):
            continue
        try:
            mode = os.stat(entry.path).st_mode
        except FileNotFoundError:
            raise ModelLoadError(f"'{name}': {entry.name} in {path} is a broken link",
                                 hint="download the model again (the file it points to is gone)") from None
        except OSError as exc:
            raise ModelLoadError(f"'{name}': {entry.name} in {path} cannot be read: {exc.strerror}",
                                 hint="check the file's permissions") from None
        if not stat.S_ISREG(mode):
            raise ModelLoadError(f"'{name}': {entry.name} in {path} is {_kind(mode)}, not a regular file",
                                 hint="replace it with the real file; codila opens only regular files from a model folder")


def open_regular(file: Path, *, name: str) -> int:
    """A descriptor of ``file``, opened without blocking (a FIFO would wait for a writer) and refused
    unless it is a regular file; the caller closes it."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ModelLoadError(f"'{name}': {file.name} cannot be read: {exc.strerror} ({file})",
                             hint="the checkpoint is damaged: copy it again") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ModelLoadError(f"'{name}': {file.name} in {file.parent} is {_kind(mode)}, not a regular file",
                             hint="replace it with the real file; codila opens only regular files from a model folder")
    os.set_blocking(fd, True)
    return fd


def read_json(file: Path, *, name: str, limit: int = JSON_LIMIT) -> Any:
    """``file`` parsed as JSON: a regular file of at most ``limit`` bytes, UTF-8, nested shallowly enough
    for the parser; anything else is one ModelLoadError naming it."""
    fd = open_regular(file, name=name)
    with os.fdopen(fd, "rb") as fh:
        if os.fstat(fh.fileno()).st_size > limit:
            raise ModelLoadError(f"'{name}': {file.name} is over {limit // 2**20} MiB ({file})",
                                 hint="the checkpoint is damaged: copy it again")
        raw = fh.read(limit + 1)
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"'{name}': {file.name} is not valid JSON: {exc} ({file})",
                             hint="the checkpoint is damaged: copy it again") from None
    except RecursionError:
        raise ModelLoadError(f"'{name}': {file.name} is nested too deeply to read ({file})",
                             hint="the checkpoint is damaged: copy it again") from None
