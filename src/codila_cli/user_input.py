"""One way to read what a user gives codila: files, ``-`` (stdin) and paths named by environment
variables (issue 40, item 5). Nothing here prints.

Every read (:func:`read_bytes`, :func:`read_text`, :func:`lines`) names its source in its errors (``config
file ~/.config/codila/config.toml``, ``--benchmark tasks.jsonl``, ``stdin``), and:

* refuses what is not a regular file (a directory, a FIFO, a device, a socket) before reading a byte:
  the file is opened non-blocking and checked with ``fstat`` on the open descriptor, so a FIFO that
  replaces a file between the check and the read cannot hang the command;
* caps the size per kind (:data:`LIMITS`; stdin is read to the cap and no further, so ``gen - <
  /dev/zero`` ends at once);
* says what went wrong in the user's words: no such file, a broken symlink, a symlink loop, a
  directory on the path that cannot be entered, permission denied, not UTF-8 (at which byte).

Every failure is a :class:`UsageError` (exit 2) with a hint.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

from codila_cli.errors import UsageError

MiB = 2**20
LIMITS = {  # the largest input of each kind that is plausibly not a mistake
    "prompt": 4 * MiB,  # a prompt: far more than any model's context
    "source": 8 * MiB,  # a file to fill (infill); larger "source files" are data
    "config": 1 * MiB,
    "contract": 1 * MiB,
    "task line": 4 * MiB,  # one task of a --benchmark file: no model's context holds more
    "task file": 1024 * MiB,
    "benchmark data": 256 * MiB,  # MBPP / HumanEval-Infilling files under --data-dir or CODILA_DATA
}


def _why(exc: OSError, path: Path) -> tuple[str, str]:
    """(what happened, a hint) for an OSError on ``path``."""
    code = exc.errno
    if code == errno.ELOOP:
        return "a symlink loop", "point the link at a real file"
    if code == errno.ENOENT:
        if os.path.lexists(path):
            return "a broken symlink", "point the link at an existing file"
        return "no such file", "check the path"
    if code == errno.EACCES:
        parent = path.parent
        if parent != path and not os.access(parent, os.X_OK):
            return f"permission denied (the directory {parent} cannot be entered)", "check the directories' permissions"
        return "permission denied", "check the file's permissions"
    if code == errno.ENOTDIR:
        return "a part of the path is not a directory", "check the path"
    if code == errno.ENAMETOOLONG:
        return "the path is too long", "check the path"
    return exc.strerror or str(exc), "check the path"


def _kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _open(path: Path, what: str, limit: int) -> int:
    """A read-only descriptor on the regular file ``path`` no larger than ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        why, hint = _why(exc, path)
        raise UsageError(f"{what} {path}: {why}", hint=hint) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{what} {path} is {_kind_of(info.st_mode)}, not a file", hint="give a regular file")
        if info.st_size > limit:
            raise UsageError(f"{what} {path} is {info.st_size / MiB:.1f} MiB, over the {limit / MiB:g} MiB limit",
                             hint="a file this large is a mistake here; give a smaller one")
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_bytes(source: str | Path, *, what: str, kind: str) -> bytes:
    """The bytes of ``source`` (a path, or ``"-"`` for stdin), at most ``LIMITS[kind]``."""
    limit = LIMITS[kind]
    if str(source) == "-":
        stream = getattr(sys.stdin, "buffer", None)
        raw = stream.read(limit + 1) if stream is not None else sys.stdin.read(limit + 1).encode()
        if len(raw) > limit:
            raise UsageError(f"stdin holds more than {limit / MiB:g} MiB, too large for a {kind}",
                             hint="pipe the text itself, or give a file")
        return raw
    path = Path(source).expanduser()
    fd = _open(path, what, limit)
    with os.fdopen(fd, "rb") as fh:
        try:
            raw = fh.read(limit + 1)
        except OSError as exc:
            why, hint = _why(exc, path)
            raise UsageError(f"{what} {path}: {why}", hint=hint) from None
    if len(raw) > limit:  # it grew after the check
        raise UsageError(f"{what} {path} is over the {limit / MiB:g} MiB limit", hint="give a smaller file")
    return raw


def decode(raw: bytes, *, where: str, bom: bool = False) -> str:
    """UTF-8 text (a leading byte-order mark dropped with ``bom``); the error says at which byte."""
    try:
        return raw.decode("utf-8-sig" if bom else "utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{where} is not UTF-8 text (byte {exc.start})", hint="save it as UTF-8") from None


def read_text(source: str | Path, *, what: str, kind: str, bom: bool = False) -> str:
    where = "stdin" if str(source) == "-" else f"{what} {Path(source).expanduser()}"
    return decode(read_bytes(source, what=what, kind=kind), where=where, bom=bom)


def lines(source: Path, *, what: str) -> Iterator[tuple[int, str]]:
    """(line number, text) of a task file, streamed: each line at most ``LIMITS['task line']``, the file
    at most ``LIMITS['task file']``; a longer line is an error naming it, not a minute of parsing."""
    line_cap = LIMITS["task line"]
    path = Path(source).expanduser()
    fd = _open(path, what, LIMITS["task file"])
    with os.fdopen(fd, "rb") as fh:
        for lineno in range(1, 2**62):
            raw = fh.readline(line_cap + 1)
            if not raw:
                return
            if len(raw) > line_cap and not raw.endswith(b"\n"):
                raise UsageError(f"{what} {path} line {lineno} is over the {line_cap / MiB:g} MiB limit for one task",
                                 hint="no model's context holds a task this large; shorten or remove it")
            yield lineno, decode(raw, where=f"{what} {path} line {lineno}", bom=lineno == 1)
