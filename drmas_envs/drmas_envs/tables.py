"""Table files as the Hugging Face hub serves them (JSONL, JSON, Parquet): reading rows, finding a split's files.

A dataset repo downloaded once with `hf download REPO --repo-type dataset --local-dir DIR` keeps the
hub's layout (`test.jsonl`, `data/train-00000-of-00001.parquet`, `<config>/test-*.parquet`, ...);
`split_files` picks a split's files by the same rule on the hub's file list and in such a folder.
Parquet needs `pyarrow`, an optional dependency (`pip install 'drmas-envs[data]'`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from drmas_envs.data import DataError, iter_jsonl_numbered

TABLE_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")
"""The file kinds a dataset may come in."""

Row = tuple[str, dict[str, Any]]
"""(where, row): `where` names the file and line ("f.jsonl:3") or row ("f.parquet: row 3") in errors."""


def is_table(name: str) -> bool:
    """Whether a file name is one of `TABLE_SUFFIXES`."""
    return name.endswith(TABLE_SUFFIXES)


def iter_rows(
    path: str | os.PathLike, columns: Sequence[str] | None = None, on_error: Callable[[DataError], None] | None = None
) -> Iterator[Row]:
    """The rows of a JSONL(.gz), JSON (a list, or {"data": [...]}) or Parquet file, each with where it is.

    Args:
        path: the file.
        columns: Parquet only: read just these columns (those the file has), to keep large files cheap.
        on_error: gets a malformed JSONL line's error instead of it being raised (`drmas_envs.data.RowErrors`).

    Raises:
        DataError: a malformed line or row (named by file and line/row), or Parquet without pyarrow.
        FileNotFoundError: no such file.

    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    if path.name.endswith(".parquet"):
        yield from _parquet_rows(path, columns)
    elif path.name.endswith(".json"):
        yield from _json_rows(path)
    else:
        for lineno, item in iter_jsonl_numbered(path, on_error=on_error):
            yield f"{path}:{lineno}", item


def _json_rows(path: Path) -> Iterator[Row]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of objects (or {{'data': [...]}})")
    for i, item in enumerate(data, start=1):
        if not isinstance(item, dict):
            raise DataError(f"{path}: item {i}: expected a JSON object, got {type(item).__name__}")
        yield f"{path}: item {i}", item


def _parquet_rows(path: Path, columns: Sequence[str] | None) -> Iterator[Row]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(
            f"{path} is a Parquet file; reading it needs pyarrow: pip install pyarrow "
            "(or pip install 'drmas-envs[data]')"
        ) from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for a file that is not Parquet
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    names = pf.schema_arrow.names
    wanted = [c for c in columns if c in names] if columns else None
    i = 0
    for batch in pf.iter_batches(columns=wanted):
        for row in batch.to_pylist():
            i += 1
            yield f"{path}: row {i}", row


_SPLIT_WORDS = ("train", "training", "test", "testing", "validation", "valid", "val", "dev", "eval", "evaluation")


def _names_split(path: str, split: str) -> bool:
    """Whether `split` is a word of `path`, delimited as the `datasets` library delimits split names."""
    return re.search(rf"(^|[-._ 0-9/]){re.escape(split)}([-._ 0-9/]|$)", path) is not None


def split_files(names: Iterable[str], split: str, config: str | None = None) -> list[str]:
    """The files among a repo's (relative, "/"-separated) `names` that hold `split`, sorted.

    First choice: `<split>.<ext>`, `<split>-<shard...>.<ext>` or any table under a `<split>/` folder.
    Else, as the `datasets` library resolves a repo without such names: files naming the split as a
    word (`dapo_train.parquet`), and for "train", every table when no file names any split. With a
    `config`, only files under `<config>/` count.
    """
    tables = [n for n in names if is_table(n)]
    if config:  # a repo of several configs (FlashRAG: one folder per dataset); another config's files never count
        tables = [n for n in tables if n.startswith(f"{config}/")]
    exact = []
    for name in tables:
        p = PurePosixPath(name)
        stem = p.name.split(".")[0]
        if stem == split or stem.startswith(f"{split}-") or split in p.parent.parts:
            exact.append(name)
    if exact:
        return sorted(exact)
    worded = [n for n in tables if _names_split(n, split)]
    if worded or split != "train":
        return sorted(worded)
    if any(_names_split(n, w) for n in tables for w in _SPLIT_WORDS):
        return []
    return sorted(tables)


def local_split_files(root: Path, split: str, config: str | None = None) -> list[Path]:
    """`split_files` in a local folder holding a downloaded repo (its `.cache/` ignored)."""
    if not root.is_dir():
        return []
    names = [
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and ".cache" not in p.relative_to(root).parts
    ]
    return [root / n for n in split_files(names, split, config)]
