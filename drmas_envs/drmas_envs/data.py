"""Reading datasets: JSONL files (optionally gzipped) with errors that name the file and line."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

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


BadRows = Literal["error", "skip"]
"""What a malformed row does: "error" stops the load with one line naming file and row; "skip" leaves it
out, counted (`RowErrors`)."""


class RowErrors:
    """What a load does with malformed rows (`BadRows`); under "skip", how many and where the first ones were.

    Called with each row's `DataError`: re-raises it under "error", counts it under "skip".
    """

    KEEP = 5
    """Skipped rows whose error is kept (file and line) for the log and the provenance."""

    def __init__(self, mode: BadRows = "error"):
        if mode not in ("error", "skip"):
            raise ValueError(f"bad_rows must be 'error' or 'skip', got {mode!r}")
        self.mode, self.count, self.first = mode, 0, []

    def __call__(self, error: DataError) -> None:
        if self.mode == "error":
            raise error
        self.count += 1
        if len(self.first) < self.KEEP:
            self.first.append(str(error))

    def record(self) -> dict[str, Any]:
        """The provenance fields of the skipped rows (nothing when none was skipped)."""
        return {"skipped_rows": self.count, "first_skipped": list(self.first)} if self.count else {}


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


def iter_jsonl_numbered(
    path: str | os.PathLike, required: Sequence[str] = (), on_error: Callable[[DataError], None] | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """Like `iter_jsonl`, yielding (line number, object), so callers can name the line in their own checks.

    `on_error` (e.g. a `RowErrors`) gets each malformed line's error instead of it being raised; reading
    goes on with the next line when it returns.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    with gzip.open(path) if path.suffix == ".gz" else open(path, "rb") as fh:  # bytes: a bad byte names its line
        for lineno, raw in enumerate(fh, start=1):
            item, why = _json_line(raw)
            if why is None and item is not None:
                missing = [f for f in required if f not in item]
                why = f"missing field(s) {missing}" if missing else None
            if why is not None:
                if on_error is None:
                    raise DataError(f"{path}:{lineno}: {why}")
                on_error(DataError(f"{path}:{lineno}: {why}"))
            elif item is not None:
                yield lineno, item


def _json_line(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """(object, None), (None, None) for a blank line, or (None, why the line is not a JSON object)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 text (byte {raw[exc.start]:#04x} at column {exc.start + 1})"
    if not line.strip():
        return None, None
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg})"
    except RecursionError:
        return None, "JSON nested too deeply to read"
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        return None, f"not readable JSON ({exc})"
    if not isinstance(item, dict):
        return None, f"expected a JSON object, got {type(item).__name__}"
    return item, None


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
