"""Training text for ``codila train align --data SOURCE`` (docs/training.md, "Data sources").

    DIR              source files under DIR that match ``--glob`` (default ``**/*.py``), one document each
    FILE.jsonl       one JSON object per line; the document is its ``--field`` (default ``text``)
    FILE.parquet     a Parquet table; the document is the column ``--field``
    DIR (datasets)   a Hugging Face ``datasets`` Dataset or DatasetDict written by ``save_to_disk``
                     (DIR holds ``dataset_info.json`` or ``dataset_dict.json``); a DatasetDict's ``train``
                     split, the column ``--field``
    bundled:RUN      the corpus ``codila train corpus --run-dir RUN`` built (RUN/corpus/*.jsonl)

:func:`parse_source` checks a source without reading it all (bad input: UsageError, exit 2);
:func:`documents` yields its texts in a fixed order, so the same source always gives the same data and
the same hash (recorded in the helper's config.json).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from codila_cli.errors import UsageError

KINDS = ("files", "jsonl", "parquet", "datasets", "bundled")
SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "node_modules", ".tox", ".mypy_cache"}
MAX_FILE_BYTES = 4 * 2**20  # larger "source files" are data or generated code: skipped
MAX_LINE_BYTES = 4 * MAX_FILE_BYTES  # a JSON line holding one such file, escapes and all


@dataclass(frozen=True)
class Source:
    kind: str  # one of KINDS
    path: Path
    field: str = "text"
    glob: str = "**/*.py"

    def describe(self) -> dict:
        out = {"kind": self.kind, "path": str(self.path)}
        if self.kind in ("jsonl", "parquet", "datasets"):
            out["field"] = self.field
        if self.kind == "files":
            out["glob"] = self.glob
        return out


def parse_source(spec: str, *, field: str = "text", glob: str = "**/*.py") -> Source:
    """The kind of ``spec``, checked: it exists, it is readable, and what it needs is installed."""
    if not spec:
        raise UsageError("--data is empty", hint="give a directory of source files, a .jsonl/.parquet file, "
                         "a datasets directory or bundled:RUN_DIR")
    if spec.startswith("bundled:"):
        run = Path(spec.removeprefix("bundled:"))
        if not (run / "corpus" / "train.jsonl").is_file():
            raise UsageError(f"--data {spec}: no corpus in {run}",
                             hint=f"build it first: codila train corpus --run-dir {run}")
        return Source("bundled", run, "text", glob)
    path = Path(spec).expanduser()
    if not path.exists():
        raise UsageError(f"--data {spec}: no such file or directory", hint="check the path")
    if not path.is_dir() and not path.is_file():  # a FIFO would block the reader, a device never end
        import os

        from codila_cli.user_input import _kind_of

        raise UsageError(f"--data {spec} is {_kind_of(os.stat(path).st_mode)}, not a file or a directory",
                         hint="give a directory of source files, a .jsonl/.parquet file or a datasets directory")
    if path.is_dir():
        if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file():
            _need("datasets", "a datasets directory")
            return Source("datasets", path, field, glob)
        return Source("files", path, field, glob)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return Source("jsonl", path, field, glob)
    if suffix in (".parquet", ".pq"):
        _need("pyarrow", "a Parquet file")
        return Source("parquet", path, field, glob)
    raise UsageError(f"--data {spec}: unknown format {suffix or '(no suffix)'}",
                     hint="give a directory, a .jsonl or .parquet file, or a datasets directory (save_to_disk)")


def _need(module: str, what: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise UsageError(f"reading {what} needs the Python package {module!r}, which is not installed",
                         hint="pip install 'codila[train]'")


def _files(src: Source) -> Iterator[str]:
    for p in sorted(src.path.glob(src.glob)):
        if not p.is_file() or SKIP_DIRS.intersection(p.relative_to(src.path).parts[:-1]):
            continue
        try:
            if p.stat().st_size > MAX_FILE_BYTES:
                continue
            yield p.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # unreadable or not UTF-8: not source text


def _jsonl(src: Source, path: Path | None = None) -> Iterator[str]:
    """The documents of a JSON-lines file, read a line at a time, each at most MAX_LINE_BYTES (a longer line
    is an error naming it, not a tokenizer that runs out of memory: issue 53)."""
    path = path or src.path
    with open(path, "rb") as fh:
        for lineno in range(1, 2**62):
            raw = fh.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                raise UsageError(f"{path} line {lineno} is over {MAX_LINE_BYTES // 2**20} MiB, more than one source "
                                 "document can be", hint="split it, or leave it out of the training data")
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise UsageError(f"{path} line {lineno} is not UTF-8", hint="write the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path} line {lineno} is not JSON ({exc.msg})",
                                 hint="one JSON object per line") from None
            value = row.get(src.field) if isinstance(row, dict) else None
            if not isinstance(value, str):
                raise UsageError(f"{path} line {lineno} has no text field {src.field!r}",
                                 hint="name the field with --field")
            yield value


def _column(table_columns: list[str], field: str, where: Path) -> None:
    if field not in table_columns:
        raise UsageError(f"{where} has no column {field!r} (it has {', '.join(table_columns[:8])})",
                         hint="name the text column with --field")


def _parquet(src: Source) -> Iterator[str]:
    import pyarrow.parquet as pq

    f = pq.ParquetFile(src.path)
    _column(f.schema_arrow.names, src.field, src.path)
    for batch in f.iter_batches(columns=[src.field], batch_size=1024):
        yield from (v for v in batch.column(0).to_pylist() if isinstance(v, str))


def _datasets(src: Source) -> Iterator[str]:
    from datasets import DatasetDict, load_from_disk

    ds = load_from_disk(str(src.path))
    if isinstance(ds, DatasetDict):
        if "train" not in ds:
            raise UsageError(f"{src.path} has no 'train' split (it has {', '.join(ds)})",
                             hint="save the split to train on as 'train'")
        ds = ds["train"]
    _column(list(ds.column_names), src.field, src.path)
    for v in ds[src.field]:
        if isinstance(v, str):
            yield v


def documents(src: Source) -> Iterator[str]:
    """Every non-empty document of the source, in a fixed order."""
    if src.kind == "bundled":
        gen: Iterator[str] = (t for name in ("train.jsonl", "valid.jsonl")
                              for t in _jsonl(src, src.path / "corpus" / name))
    else:
        gen = {"files": _files, "jsonl": _jsonl, "parquet": _parquet, "datasets": _datasets}[src.kind](src)
    for text in gen:
        if text.strip():
            yield text


def is_valid_document(text: str, fraction: float) -> bool:
    """The held-out split: a document's own hash decides, so it never depends on order or world size."""
    h = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")
    return h / 2**64 < fraction
