"""Write a file whole or not at all: a temporary file beside the target, fsynced, then swapped in.

Only over what codila may replace (issue 53): a regular file with one link (a symlink's target is
written and the link kept), writable by this user and owned by them (or by anyone, as root); its mode,
owner and group go to the new version. Given the bytes the caller read (``expect``), a change made by
someone else meanwhile is never lost: where the kernel swaps two names atomically (Linux's
``renameat2(RENAME_EXCHANGE)``) the old version is checked after the swap and swapped back if it
changed; elsewhere it is checked just before the rename. Either way the other writer's version stays
in place and codila's is kept beside it (:class:`FileChangedError` names both).
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from codila_cli.errors import CodilaError
from codila_cli.user_input import _kind_of


class FileChangedError(CodilaError):
    """The target changed on disk after codila read it: it was left as the other writer made it."""


def write_bytes_atomic(target: Path, data: bytes, *, expect: bytes | None = None) -> None:
    """``target`` holds ``data`` afterwards, or (on any error or interrupt) is as it was before;
    ``expect``: what the caller read from it (refuse, keeping both versions, if it holds other bytes)."""
    real = Path(os.path.realpath(target)) if os.path.islink(target) else Path(target)
    info = replaceable(real, shown=Path(target))
    fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".codila")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if info is not None:
            keep_metadata(tmp, info, shown=Path(target))
        swap_in(tmp, real, expect=expect if info is not None else None, shown=Path(target))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text_atomic(target: Path, text: str, *, expect: bytes | None = None) -> None:
    write_bytes_atomic(target, text.encode("utf-8"), expect=expect)


def replaceable(path: Path, *, shown: Path, instead: str = "give another path") -> os.stat_result | None:
    """The stat of ``path`` if codila may replace it (None: it does not exist); else a CodilaError whose
    hint ends with ``instead`` (what the user can do rather than let codila write)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise CodilaError(f"{shown} is {_kind_of(info.st_mode)}, not a regular file; nothing was written",
                          hint="give the path of a regular file (or of none yet)")
    if info.st_nlink > 1:
        raise CodilaError(f"{shown} has {info.st_nlink} hard links, which replacing it would split; nothing was written",
                          hint=f"edit it in place yourself, or {instead}")
    if os.geteuid() != 0 and info.st_uid != os.geteuid():
        raise CodilaError(f"{shown} belongs to another user, whose ownership codila cannot keep; nothing was written",
                          hint=f"run codila as its owner, or {instead}")
    if not info.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(path, os.W_OK):
        raise CodilaError(f"{shown} is read-only; nothing was written", hint=f"make it writable first (chmod u+w), or {instead}")
    return info


def keep_metadata(tmp: str, info: os.stat_result, *, shown: Path) -> None:
    """The old version's owner, group and mode onto the new one (before it is swapped in)."""
    try:
        os.chown(tmp, info.st_uid if os.geteuid() == 0 else -1, info.st_gid)
    except PermissionError:
        raise CodilaError(f"{shown}: its group cannot be kept; nothing was written",
                          hint="run codila as a member of the file's group") from None
    os.chmod(tmp, stat.S_IMODE(info.st_mode))


def swap_in(tmp: str, real: Path, *, expect: bytes | None, shown: Path) -> None:
    """Rename ``tmp`` over ``real``; with ``expect``, only if ``real`` still holds those bytes."""
    if expect is None:
        os.replace(tmp, real)
        return
    if _exchange(tmp, real):  # real is the new version now, tmp the old one: was it still what was read?
        if _holds(Path(tmp), expect):
            os.unlink(tmp)
            return
        _exchange(tmp, real)  # put the other writer's version back
    elif _holds(real, expect):
        os.replace(tmp, real)
        return
    kept = real.with_name(real.name + ".codila-new")
    os.replace(tmp, kept)
    raise FileChangedError(f"{shown} changed on disk while codila was writing it; it was left as it is, and "
                           f"codila's version is in {kept}", hint="merge the two, or run codila again")


def _holds(path: Path, expect: bytes) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(len(expect) + 1) == expect
    except OSError:
        return False


def _exchange(a: str | Path, b: str | Path) -> bool:
    """Swap two names atomically (Linux renameat2 RENAME_EXCHANGE); False where it is not available."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (38, 22, 95):  # ENOSYS, EINVAL (the file system cannot), EOPNOTSUPP
        return False
    raise OSError(err, os.strerror(err), str(b))


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
