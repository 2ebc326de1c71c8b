"""Reading datasets: JSONL files (optionally gzipped) with errors that name the file and line."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

DATA_DIR_ENV = "DRMAS_DATA_DIR"
"""Environment variable naming a local directory searched for known dataset names."""


HUB_OFFLINE_ENV = "HF_HUB_OFFLINE"
"""The Hugging Face hub's own offline switch: when set (1/true/yes), known names are never fetched."""


class DataError(ValueError):
    """A dataset file or item is malformed; the message names the file and line."""


class DatasetNotFoundError(FileNotFoundError):
    """A known dataset is neither in a local data directory nor reachable on the hub.

    The message is one line: the dataset, every place looked, why the hub failed, and how to provide it.
    """


def hub_offline() -> bool:
    """Whether $HF_HUB_OFFLINE asks not to contact the hub (read at call time, not import time)."""
    return os.environ.get(HUB_OFFLINE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def iter_jsonl(path: str | os.PathLike, required: Sequence[str] = ()) -> Iterator[dict[str, Any]]:
    """Yield the objects of a JSONL (or JSONL.gz) file, checking that `required` fields exist.

    Raises:
        DataError: a line is not a JSON object or lacks a required field ("file:line: why").
        FileNotFoundError: the path does not exist.

    """
    for _, item in iter_jsonl_numbered(path, required):
        yield item


def iter_jsonl_numbered(path: str | os.PathLike, required: Sequence[str] = ()) -> Iterator[tuple[int, dict[str, Any]]]:
    """Like `iter_jsonl`, yielding (line number, object), so callers can name the line in their own checks."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    with gzip.open(path) if path.suffix == ".gz" else open(path, "rb") as fh:  # bytes: a bad byte names its line
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                bad = f"byte {raw[exc.start]:#04x} at column {exc.start + 1}"
                raise DataError(f"{path}:{lineno}: not UTF-8 text ({bad})") from None
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            except RecursionError:
                raise DataError(f"{path}:{lineno}: JSON nested too deeply to read") from None
            except ValueError as exc:  # e.g. an integer of more digits than Python converts
                raise DataError(f"{path}:{lineno}: not readable JSON ({exc})") from None
            if not isinstance(item, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(item).__name__}")
            missing = [f for f in required if f not in item]
            if missing:
                raise DataError(f"{path}:{lineno}: missing field(s) {missing}")
            yield lineno, item


def read_jsonl(path: str | os.PathLike, required: Sequence[str] = ()) -> list[dict[str, Any]]:
    """All objects of a JSONL file; see `iter_jsonl`."""
    return list(iter_jsonl(path, required))


def data_dirs(data_dir: str | os.PathLike | None = None) -> list[Path]:
    """Local directories searched for known dataset names: the argument, then $DRMAS_DATA_DIR."""
    dirs = [Path(data_dir)] if data_dir else []
    if os.environ.get(DATA_DIR_ENV):
        dirs.append(Path(os.environ[DATA_DIR_ENV]))
    return dirs


def find_local(candidates: Sequence[str], data_dir: str | os.PathLike | None = None) -> Path | None:
    """The first existing file among `candidates` (relative names) in the local data directories."""
    for root in data_dirs(data_dir):
        for rel in candidates:
            p = root / rel
            if p.is_file():
                return p
    return None
