"""Where to fill in a file, how to indent the middle, and how to write the result without losing data.

Pure Python (no torch). Line numbers are 1-based. Only regular files up to MAX_BYTES are read. The
bytes outside the filled region are written back exactly as read: a UTF-8 BOM, and each line's own
ending (a file mixing LF and CRLF keeps both; the fill's lines take the file's majority ending). A
symlink's target is edited and the link kept; in-place writes go to a temporary file beside the target,
are fsynced and renamed over it with the original owner, group and mode, under an advisory lock, and
only if the file is unchanged since it was read; read-only and hard-linked files are refused (a rename
would overwrite the one and split the other), as is a file whose owner codila cannot keep (exit 1).
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codila_cli.atomic import FileChangedError, keep_metadata, replaceable, swap_in
from codila_cli.errors import CodilaError, UsageError
from codila_cli.user_input import LIMITS

MARKER = re.compile(r"^[ \t]*(?:#|//|--|;|/\*|<!--|\(\*)\s*codila:\s*fill\b.*$")  # in any language's comment
MAX_BYTES = LIMITS["source"]  # larger "source files" are data: refused (user_input.py)


@dataclass(frozen=True)
class Source:
    """A file's text with '\\n' newlines, plus what is needed to write it back identically."""

    text: str
    newline: str  # "\n" or "\r\n"
    path: Path | None  # None for stdin; the symlink target when the user named a link
    digest: str  # sha256 of the raw bytes read
    trailing_newline: bool
    bom: bool = False  # the file started with a UTF-8 byte order mark
    endings: tuple[str, ...] = ()  # each line's own ending as read ("\n", "\r\n", "" for a last line without)
    language: Any = None  # languages.Language (read_source: --language, extension, #! line); None: unknown
    guessed: str = ""  # how the language was guessed from the text alone ("the #! line", "a modeline", …)

    @property
    def rules(self) -> Any:
        """The language whose block rules place the fill: the file's, else one that knows `:` and braces."""
        from codila_cli.languages import GENERIC

        return self.language or GENERIC

    @property
    def lines(self) -> list[str]:
        return self.text.split("\n")[:-1] if self.trailing_newline else self.text.split("\n")


def read_source(name: str, *, stdin_bytes: bytes | None = None, language: str | None = None) -> Source:
    """The file ``name`` (a symlink's target), or stdin for ``-`` (refused when stdin is a terminal).

    Its language: ``language`` (a name languages.py knows, else UsageError), the extension, a ``#!`` line;
    for stdin with none of these, Python if the text parses as Python, else unknown (not checked)."""
    if name == "-":
        if stdin_bytes is None and sys.stdin.isatty():
            raise UsageError("FILE is `-` but stdin is a terminal", hint="pipe a file: cat a.py | codila infill - --line 3")
        raw = stdin_bytes if stdin_bytes is not None else sys.stdin.buffer.read(MAX_BYTES + 1)
        path = None
    else:
        from codila_cli.user_input import read_bytes

        raw = read_bytes(name, what="FILE", kind="source")  # a regular file, capped; loops, FIFOs refused
        path = Path(name).resolve()  # a symlink is followed: its target is what gets edited
    if len(raw) > MAX_BYTES:
        raise UsageError(f"{name} is over the {MAX_BYTES // 2**20} MiB limit", hint="fill a smaller file")
    if b"\x00" in raw[:8192]:
        raise UsageError(f"{name} looks binary (it contains NUL bytes)", hint="codila infill edits text files")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{name} is not UTF-8 (byte {exc.start})", hint="convert the file to UTF-8 first") from None
    bom = text.startswith("\ufeff")
    if bom:
        text = text[1:]
    parts = text.split("\n")
    endings = tuple("\r\n" if p.endswith("\r") else "\n" for p in parts[:-1]) + (("",) if parts[-1] else ())
    newline = "\r\n" if endings.count("\r\n") > endings.count("\n") else "\n"
    text = text.replace("\r\n", "\n")
    lang, guessed = _language(language, None if name == "-" else name, text)
    return Source(text, newline, path, hashlib.sha256(raw).hexdigest(), text.endswith("\n"), bom, endings, lang,
                  guessed)


def _language(language: str | None, path: str | None, text: str) -> tuple[Any, str]:
    """(the language, how it was guessed: "" when named by --language or an extension). Stdin (an editor's
    buffer) names none: its ``#!`` line or modeline does, else text that Python parses is Python."""
    from codila_cli import languages

    try:
        lang = languages.resolve(language=language, path=path, text=text)
    except ValueError as exc:
        raise UsageError(str(exc).split(" (known")[0], hint=f"--language takes one of: {', '.join(languages.names())}") from None
    if language or (path and languages.for_path(path)):
        return lang, ""
    if lang is not None:
        return lang, "the #! line" if languages.for_shebang(text) is not None else "a modeline"
    if path is None:
        from codila_cli.syntax import check_python

        return (languages.PYTHON, "the text, which Python parses") if check_python(text).valid else (None, "")
    return None, ""


@dataclass(frozen=True)
class Region:
    """Replace lines [start, end) (0-based, end exclusive; start == end inserts) of the source."""

    start: int
    end: int
    indent: str
    how: str  # "line", "lines" or "marker"


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def indent_unit(lines: list[str]) -> str:
    """One indentation level of the file: a tab if it indents with tabs, else the most common step by
    which a line is indented deeper than the non-blank line before it (4 spaces when there is none)."""
    if uses_tabs("\n".join(lines)):
        return "\t"
    steps: dict[int, int] = {}
    prev = 0
    for line in lines:
        if line.strip():
            width = len(_indent_of(line).expandtabs(4))
            if width > prev:
                steps[width - prev] = steps.get(width - prev, 0) + 1
            prev = width
    return " " * (max(steps, key=lambda k: (steps[k], -k)) if steps else 4)


def _context_indent(lines: list[str], start: int, end: int, lang: Any) -> str:
    """Indentation the middle should have: the first non-blank line after it, else the block opened before
    it (a line ending in the language's block opener: Python's `:`, a brace, the shell's `then`)."""
    prev = next((lines[i] for i in range(start - 1, -1, -1) if lines[i].strip()), None)
    if prev is not None and lang.opens_block(prev):
        inner = _indent_of(prev) + indent_unit(lines)
        nxt = next((lines[i] for i in range(end, len(lines)) if lines[i].strip()), None)
        return _indent_of(nxt) if nxt is not None and len(_indent_of(nxt)) > len(_indent_of(prev)) else inner
    nxt = next((lines[i] for i in range(end, len(lines)) if lines[i].strip()), None)
    if nxt is not None:
        return _indent_of(nxt)
    return _indent_of(prev) if prev is not None else ""


def find_region(src: Source, *, line: int | None, lines_range: str | None) -> Region:
    lines = src.lines
    n = len(lines)
    if line is not None and lines_range is not None:
        raise UsageError("give --line or --lines, not both", hint="drop one of them")
    if line is not None:
        if not (1 <= line <= n + 1):
            raise UsageError(f"--line {line} is out of range (the file has {n} line{'s' * (n != 1)})",
                             hint=f"give a line from 1 to {n}, or {n + 1} to append at the end")
        return Region(line - 1, line - 1, _context_indent(lines, line - 1, line - 1, src.rules), "line")
    if lines_range is not None:
        m = re.fullmatch(r"\s*(\d+)\s*[-:]\s*(\d+)\s*", lines_range)
        if not m:
            raise UsageError(f"--lines {lines_range!r} is not A-B", hint="e.g. --lines 10-14")
        a, b = int(m.group(1)), int(m.group(2))
        if a > b:
            raise UsageError(f"--lines {a}-{b} is reversed", hint=f"use --lines {b}-{a}")
        if a < 1 or b > n:
            raise UsageError(f"--lines {a}-{b} is out of range (the file has {n} line{'s' * (n != 1)})",
                             hint=f"give lines within 1-{n}")
        indent = _indent_of(lines[a - 1]) if lines[a - 1].strip() else _context_indent(lines, a - 1, b, src.rules)
        return Region(a - 1, b, indent, "lines")
    hits = [i for i, text in enumerate(lines) if MARKER.match(text)]
    if not hits:
        comment = src.language.comment if src.language is not None else "#"
        raise UsageError("no fill marker found", hint=f"add a line `{comment} codila: fill`, or use --line N / --lines A-B")
    if len(hits) > 1:
        raise UsageError(f"{len(hits)} fill markers found (lines {', '.join(str(h + 1) for h in hits[:5])})",
                         hint="keep one `# codila: fill` line, or use --line / --lines")
    i = hits[0]
    return Region(i, i + 1, _indent_of(lines[i]), "marker")


def split(src: Source, region: Region) -> tuple[str, str]:
    """(prefix, suffix) text around the region; the prefix ends with a newline unless empty."""
    lines = src.lines
    prefix = "".join(line + "\n" for line in lines[: region.start])
    rest = lines[region.end :]
    suffix = "\n".join(rest) + ("\n" if rest and src.trailing_newline else "")
    return prefix, suffix


def uses_tabs(text: str) -> bool:
    """Whether a file indents with tabs: more indented lines start with a tab than with a space."""
    firsts = [line[0] for line in text.splitlines() if line[:1] in (" ", "\t") and line.strip()]
    return firsts.count("\t") > firsts.count(" ")


def fit_indent(middle: str, indent: str, *, tabs: bool = False) -> str:
    """Shift the middle so its least-indented line sits at ``indent``; keep relative indentation.

    ``tabs``: the file indents with tabs (an ``indent`` starting with a tab says so too). Then the
    middle's relative indentation is written with one tab per level, a level being the smallest relative
    indentation the middle uses (models write spaces; a tab-indented file mixing in spaces no longer
    parses); otherwise with spaces (4 per tab). The result ends with a newline unless it is empty.
    """
    lines = [line.rstrip() for line in middle.replace("\r\n", "\n").strip("\n").split("\n")]
    body = [line for line in lines if line.strip()]
    if not body:
        return ""
    tabs = tabs or indent.startswith("\t")
    least = min((_indent_of(line) for line in body), key=len)
    rel = [line[len(least) :] if line.strip() else "" for line in lines]
    widths = [len(_indent_of(r).expandtabs(4)) for r in rel]
    unit = min((w for w in widths if w), default=4)
    out = []
    for r, w in zip(rel, widths):
        if not r:
            out.append("")
            continue
        lead = "\t" * (w // unit) + " " * (w % unit) if tabs else " " * w
        out.append(indent + lead + r.lstrip(" \t"))
    return "\n".join(out) + "\n"


def _deepest_indent(lines: list[str], start: int, lang: Any) -> int:
    """The widest indentation a line inserted before line ``start`` can have: the previous non-blank
    line's, one level more when it opens a block."""
    prev = next((lines[i] for i in range(start - 1, -1, -1) if lines[i].strip()), None)
    if prev is None:
        return 0
    width = len(_indent_of(prev).expandtabs(4))
    return width + len(indent_unit(lines).expandtabs(4)) if lang.opens_block(prev) else width


def place_middle(src: Source, region: Region, text: str) -> str:
    """The model's middle, indented to fit the file: at the region's indentation (fit_indent), unless
    that makes the file fail to parse where the model's own indentation, a legal one at that point (a
    ``return`` written inside the function being filled, before a line at column 0), makes it parse in
    the file's language (a language without a grammar keeps the region's indentation)."""
    from codila_cli.syntax import check_code

    tabs = uses_tabs(src.text)
    first = fit_indent(text, region.indent, tabs=tabs)
    body = [line for line in text.replace("\r\n", "\n").split("\n") if line.strip()]
    parses = lambda middle: check_code(patch(src, region, middle), language=src.language).valid
    if not body or src.language is None or src.language.grammar is None or parses(first):
        return first
    own = min((_indent_of(line) for line in body), key=len)
    if own == region.indent or len(own.expandtabs(4)) > _deepest_indent(src.lines, region.start, src.rules):
        return first
    second = fit_indent(text, own, tabs=tabs)
    return second if parses(second) else first


def patch(src: Source, region: Region, middle: str) -> str:
    prefix, suffix = split(src, region)
    return prefix + middle + suffix


def to_disk(text: str, newline: str) -> bytes:
    return text.replace("\n", newline).encode("utf-8")


def disk_bytes(src: Source, region: Region, middle: str) -> bytes:
    """The patched file as bytes: every byte outside the region as read (BOM, each line's ending), the
    middle's lines with the file's majority ending."""
    lines = src.lines
    ends = list(src.endings) + [""] * (len(lines) - len(src.endings))
    before = [line + end for line, end in zip(lines[: region.start], ends[: region.start])]
    if before and not ends[region.start - 1] and (middle or region.end < len(lines)):
        before[-1] += src.newline  # a last line without a newline, now followed by more
    fill = middle.replace("\n", src.newline)
    if region.end >= len(lines) and not src.trailing_newline and fill.endswith(src.newline) and region.end > region.start:
        fill = fill[: -len(src.newline)]  # the replaced last line had no newline: neither has the fill
    after = [line + end for line, end in zip(lines[region.end :], ends[region.end :])]
    return ("\ufeff" if src.bom else "").encode() + ("".join(before) + fill + "".join(after)).encode("utf-8")


def _split_kept(text: str) -> list[str]:
    """Lines split at newlines only (a form feed is no line break for git), each keeping its ending."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def original_text(src: Source) -> str:
    """The file as read (BOM and every line ending included), as text."""
    lines = src.lines
    ends = list(src.endings) + [""] * (len(lines) - len(src.endings))
    return ("\ufeff" if src.bom else "") + "".join(line + end for line, end in zip(lines, ends))


def unified_diff(src: Source, new: str | bytes, name: str) -> str:
    """A patch ``git apply`` / ``patch -p1`` accept: the lines as on disk (CRLF kept, line by line), form
    feeds inside lines, and git's ``\\ No newline at end of file`` after a last line without one.
    ``new``: the patched file's bytes (disk_bytes), or its text with '\\n' newlines."""
    after = new.decode("utf-8") if isinstance(new, bytes) else new.replace("\n", src.newline)
    out = []
    for line in difflib.unified_diff(_split_kept(original_text(src)), _split_kept(after),
                                     fromfile=f"a/{name}", tofile=f"b/{name}"):
        if line.startswith(("---", "+++")):
            out.append(line.rstrip("\r\n") + "\n")
        elif line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n\\ No newline at end of file\n")
    return "".join(out)




def write_in_place(src: Source, new_text: str | bytes) -> None:
    """Atomic replace: temp file beside the target, fsync, the same owner, group and mode, rename;
    refuse if it changed, if it is read-only or hard-linked, or if its owner cannot be kept.
    ``new_text``: the bytes to write (disk_bytes), or text in '\\n' form written with the file's ending."""
    import fcntl

    assert src.path is not None
    path = src.path
    with open(path, "rb") as locked:
        fcntl.flock(locked, fcntl.LOCK_EX)
        try:
            current = path.read_bytes()  # through the path: a rename by another writer is seen
            if hashlib.sha256(current).hexdigest() != src.digest:
                raise FileChangedError(f"{path} changed on disk while codila was generating; nothing was written",
                                       hint="run codila infill again on the new version")
            info = replaceable(path, shown=path, instead="use --diff and apply the patch yourself")
            if info is None:  # removed since it was read
                raise FileChangedError(f"{path} was removed while codila was generating; nothing was written",
                                       hint="run codila infill again")
            data = new_text if isinstance(new_text, bytes) else to_disk(new_text, src.newline)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".codila")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                keep_metadata(tmp, info, shown=path)
                _copy_xattrs(path, tmp)
                # an editor that saved during the write and fsync above: its version stays, codila's goes beside it
                swap_in(tmp, path, expect=current, shown=path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
        finally:
            fcntl.flock(locked, fcntl.LOCK_UN)


def _copy_xattrs(src: Path, dst: str) -> None:
    """The file's extended attributes (tags, ACLs, SELinux labels, macOS-style metadata) onto the new
    version, or an error before anything is written: an edit in place keeps what the file carried."""
    try:
        names = os.listxattr(src)
    except OSError:  # no extended attributes on this file system
        return
    for name in names:
        try:
            os.setxattr(dst, name, os.getxattr(src, name))
        except OSError as exc:
            raise CodilaError(f"{src}: its extended attribute {name} cannot be kept ({exc.strerror}); nothing was "
                              "written", hint="use --diff and apply the change yourself") from None
