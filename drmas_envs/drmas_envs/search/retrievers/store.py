"""Corpus reading and passage stores: in memory, or a JSONL file + offsets memory-mapped from disk.

The on-disk store keeps a large corpus out of RAM: a lookup reads one line at a known offset.
"""

from __future__ import annotations

import json
import mmap
import os
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from drmas_envs.data import DataError, iter_jsonl_numbered
from drmas_envs.search.retrievers.base import passage_fields

Record = tuple[str, str, str]
"""(id, title, text) of one passage."""

PASSAGES_FILE = "passages.jsonl"
OFFSETS_FILE = "offsets.npy"


def iter_corpus(path: str | os.PathLike) -> Iterator[Record]:
    """Yield (id, title, text) from a JSONL or JSONL.gz corpus (`id`, `title`, `text` or `contents`).

    A record without `id` gets its 0-based record index as id.

    Raises:
        FileNotFoundError: no such file.
        DataError: a malformed line; the message names the file and line.

    """
    for index, (lineno, item) in enumerate(iter_jsonl_numbered(path)):
        try:
            title, text = passage_fields(item, f"{path}:{lineno}")
        except ValueError as exc:
            raise DataError(str(exc)) from None
        yield str(item.get("id", index)), title, text


class MemoryStore:
    """Passages held in a Python list (small or generated corpora)."""

    def __init__(self, records: Iterable[Record]):
        self._records = [tuple(map(str, r)) for r in records]

    def __len__(self) -> int:
        return len(self._records)

    def get(self, i: int) -> Record:
        """The i-th passage."""
        return self._records[i]

    def __iter__(self) -> Iterator[Record]:
        return iter(self._records)


class DiskStore:
    """Passages in `passages.jsonl` with byte offsets in `offsets.npy`, both memory-mapped."""

    def __init__(self, directory: str | os.PathLike):
        directory = Path(directory)
        self._offsets = np.load(directory / OFFSETS_FILE, mmap_mode="r")
        with open(directory / PASSAGES_FILE, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            self._data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def get(self, i: int) -> Record:
        """The i-th passage (one JSON line read from the mapped file)."""
        start, end = int(self._offsets[i]), int(self._offsets[i + 1])
        rec = json.loads(self._data[start:end])
        return rec[0], rec[1], rec[2]

    def __iter__(self) -> Iterator[Record]:
        return (self.get(i) for i in range(len(self)))

    @staticmethod
    def write(records: Iterable[Record], directory: str | os.PathLike) -> int:
        """Write a store into `directory`; returns the number of passages."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        offsets = array("q", [0])  # 8 bytes per passage (a list of ints would take ~5x that at 21M passages)
        end = 0
        with open(directory / PASSAGES_FILE, "wb") as fh:
            for rec in records:
                line = (json.dumps(list(rec), ensure_ascii=False) + "\n").encode("utf-8")
                fh.write(line)
                end += len(line)
                offsets.append(end)
        np.save(directory / OFFSETS_FILE, np.frombuffer(offsets, dtype=np.int64))
        return len(offsets) - 1


PassageStore = MemoryStore | DiskStore
