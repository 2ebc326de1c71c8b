"""Streamed BM25 build: the bm25s index files, written without holding the corpus's tokens in memory.

`bm25s.BM25.index` needs every passage's token list at once (Python lists of strings: several times the
index's own size, hence out of reach at wiki-18's 21M passages). Here two passes do the same job:

1. Tokenise passages chunk by chunk; spill each passage's (term id, term count) pairs to a scratch file
   and count document frequencies. Memory: the vocabulary, one length per passage, one chunk.
2. With the frequencies known, the column pointers of the (term x passage) matrix are fixed, so each
   chunk's BM25 weights are scattered straight into their final place in memory-mapped output arrays.

The output is bm25s's own save format (same files, same Lucene-variant weights), so `BM25Retriever.load`
and `bm25s.BM25.load` read it unchanged.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import bm25s
import numpy as np

from drmas_envs.search.retrievers.store import Record

Progress = Callable[[str, int, int | None], None]
"""progress(stage, done, total): called as a build advances (the CLI draws a bar from it)."""

DATA_FILE = "data.csc.index.npy"
INDICES_FILE = "indices.csc.index.npy"
INDPTR_FILE = "indptr.csc.index.npy"
CHUNK = 50_000


def _noop(stage: str, done: int, total: int | None) -> None:
    return None


def _spill_counts(
    records: Iterable[Record], tokenize: Callable[[str], list[str]], scratch: Path, chunk: int, progress: Progress
) -> tuple[dict[str, int], np.ndarray, np.ndarray, np.ndarray]:
    """Pass 1: (vocabulary, document frequencies, passage lengths, unique terms per passage)."""
    vocab: dict[str, int] = {}
    df = np.zeros(1 << 16, dtype=np.int64)
    lengths: list[np.ndarray] = []
    uniques: list[np.ndarray] = []
    n = 0
    with open(scratch / "terms.bin", "wb") as terms_fh, open(scratch / "tfs.bin", "wb") as tfs_fh:
        terms, tfs, doc_len, doc_unique = [], [], [], []

        def flush() -> None:
            nonlocal df
            t = np.asarray(terms, dtype=np.int32)
            t.tofile(terms_fh)
            np.asarray(tfs, dtype=np.float32).tofile(tfs_fh)
            if len(vocab) > len(df):
                df = np.concatenate([df, np.zeros(max(len(vocab), 2 * len(df)) - len(df), np.int64)])
            df[: len(vocab)] += np.bincount(t, minlength=len(vocab))  # a term is listed once per passage
            lengths.append(np.asarray(doc_len, dtype=np.int32))
            uniques.append(np.asarray(doc_unique, dtype=np.int32))
            for buffer in (terms, tfs, doc_len, doc_unique):
                buffer.clear()

        for _, title, text in records:
            tokens = tokenize(f"{title} {text}")
            counts = Counter(vocab.setdefault(tok, len(vocab)) for tok in tokens)
            terms.extend(counts.keys())
            tfs.extend(counts.values())
            doc_len.append(len(tokens))
            doc_unique.append(len(counts))
            n += 1
            if n % chunk == 0:
                flush()
                progress("tokenising", n, None)
        flush()
    progress("tokenising", n, n)
    return vocab, df[: len(vocab)], np.concatenate(lengths), np.concatenate(uniques)


def _idf(df: np.ndarray, n_docs: int) -> np.ndarray:
    """bm25s's Lucene idf, log(1 + (N - df + 0.5) / (df + 0.5)), float32; 0 for a term in no passage."""
    idf = np.log(1 + (n_docs - df + 0.5) / (df + 0.5)).astype(np.float32)  # log(1 + x), as bm25s (not log1p)
    idf[df == 0] = 0.0
    return idf


def _scatter(
    scratch: Path,
    out: Path,
    df: np.ndarray,
    lengths: np.ndarray,
    uniques: np.ndarray,
    *,
    k1: float,
    b: float,
    chunk: int,
    progress: Progress,
) -> None:
    """Pass 2: the weights of each spilled chunk, written at their (term, passage) place in the CSC arrays."""
    n_docs = len(lengths)
    indptr = np.zeros(len(df) + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    nnz = int(indptr[-1])
    data = np.lib.format.open_memmap(out / DATA_FILE, mode="w+", dtype=np.float32, shape=(nnz,))
    indices = np.lib.format.open_memmap(out / INDICES_FILE, mode="w+", dtype=np.int32, shape=(nnz,))
    np.save(out / INDPTR_FILE, indptr)
    idf = _idf(df, n_docs)
    avg_len = float(lengths.mean()) if n_docs else 1.0
    # as bm25s: the length norm and the term-frequency part in float64, the weight rounded to float32
    norm = k1 * ((1 - b) + b * lengths.astype(np.float64) / avg_len)
    cursor = indptr[:-1].copy()
    starts = np.concatenate([[0], np.cumsum(uniques, dtype=np.int64)])
    with open(scratch / "terms.bin", "rb") as terms_fh, open(scratch / "tfs.bin", "rb") as tfs_fh:
        for first in range(0, n_docs, chunk):
            last = min(first + chunk, n_docs)
            count = int(starts[last] - starts[first])
            terms = np.fromfile(terms_fh, dtype=np.int32, count=count)
            tfs = np.fromfile(tfs_fh, dtype=np.float32, count=count).astype(np.float64)
            docs = np.repeat(np.arange(first, last, dtype=np.int32), uniques[first:last])
            weights = (idf[terms] * (tfs / (norm[docs] + tfs))).astype(np.float32)
            order = np.argsort(terms, kind="stable")  # stable: passages stay in order within a term
            terms, docs, weights = terms[order], docs[order], weights[order]
            cols, col_start, col_count = np.unique(terms, return_index=True, return_counts=True)
            rank = np.arange(count, dtype=np.int64) - np.repeat(col_start, col_count)
            where = cursor[terms] + rank
            data[where] = weights
            indices[where] = docs
            cursor[cols] += col_count
            progress("weighting", last, n_docs)
    data.flush()
    indices.flush()


def build_bm25_files(
    records: Iterable[Record],
    out: str | os.PathLike,
    tokenize: Callable[[str], list[str]],
    *,
    k1: float = 1.5,
    b: float = 0.75,
    chunk: int = CHUNK,
    progress: Progress | None = None,
) -> int:
    """Write a bm25s index of `records` into `out` in two streamed passes; returns the passage count.

    Args:
        records: (id, title, text) in index order, read once (title and text are indexed).
        out: the folder to write (bm25s's file names).
        tokenize: text -> tokens, the same function the queries will use.
        k1: BM25 term-frequency saturation (bm25s's default 1.5).
        b: BM25 length normalisation (0.75).
        chunk: passages per chunk; memory grows with it, not with the corpus.
        progress: called as chunks finish (see `Progress`).

    """
    progress = progress or _noop
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".bm25-scratch-", dir=out) as tmp:
        vocab, df, lengths, uniques = _spill_counts(records, tokenize, Path(tmp), chunk, progress)
        if "" not in vocab:  # bm25s adds an empty token (a column with no passage) for queries with no known term
            vocab[""] = len(vocab)
            df = np.concatenate([df, [0]])
        _scatter(Path(tmp), out, df, lengths, uniques, k1=k1, b=b, chunk=chunk, progress=progress)
    with open(out / "vocab.index.json", "w", encoding="utf-8") as fh:
        json.dump(vocab, fh, ensure_ascii=False)
    params = {
        "k1": k1,
        "b": b,
        "delta": 0.5,
        "method": "lucene",
        "idf_method": "lucene",
        "dtype": "float32",
        "int_dtype": "int32",
        "num_docs": len(lengths),
        "version": bm25s.__version__,
        "backend": "numpy",
    }
    (out / "params.index.json").write_text(json.dumps(params, indent=4))
    return len(lengths)
