"""Passage vectors on disk: read a `.npy` or a flat FAISS index file memory-mapped, encode in chunks, exact top-k.

The reference serves wiki-18 from `e5_Flat.index`, a FAISS `IndexFlatIP` file: a 45-byte header then the
21M x 768 float32 vectors (~64 GB). Reading that layout directly (no faiss needed) lets the vectors be
memory-mapped and streamed in chunks, so converting or searching them never needs 64 GB of RAM.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

FLAT_FOURCC = {b"IxFI": "ip", b"IxF2": "l2"}
"""FAISS flat index file tags: inner product (the reference's e5 index) and L2."""
_FLAT_HEADER = struct.Struct("<4siqqq?iQ")  # tag, d, ntotal, 2 unused, is_trained, metric, n floats
CHUNK = 65_536


def flat_header(path: str | os.PathLike) -> tuple[str, int, int]:
    """(metric, dim, ntotal) of a FAISS flat index file ("ip" or "l2"), its size checked against its header.

    Raises:
        ValueError: not a flat FAISS file, or its size disagrees with its header (a truncated download).

    """
    path = Path(path)
    with open(path, "rb") as fh:
        head = fh.read(_FLAT_HEADER.size)
    if len(head) < _FLAT_HEADER.size or head[:4] not in FLAT_FOURCC:
        raise ValueError(f"{path}: not a flat FAISS index (IndexFlatIP/L2); tag {head[:4]!r}")
    tag, dim, ntotal, _, _, _, _, n_floats = _FLAT_HEADER.unpack(head)
    expected = _FLAT_HEADER.size + 4 * ntotal * dim
    if n_floats != ntotal * dim or path.stat().st_size != expected:
        raise ValueError(
            f"{path}: header says {ntotal} x {dim} vectors ({expected} bytes) but the file has "
            f"{path.stat().st_size} bytes; a partial download? (e5_Flat.index is part_aa + part_ab concatenated)"
        )
    return FLAT_FOURCC[tag], dim, ntotal


def read_flat_index(path: str | os.PathLike) -> np.ndarray:
    """The vectors of a FAISS flat index file (as `faiss.write_index` writes IndexFlatIP/L2), memory-mapped.

    Raises:
        ValueError: not a flat FAISS file, or its size disagrees with its header (a truncated download).

    """
    _, dim, ntotal = flat_header(path)
    return np.memmap(path, dtype=np.float32, mode="r", offset=_FLAT_HEADER.size, shape=(ntotal, dim))


def write_flat_index(vectors: np.ndarray, path: str | os.PathLike, chunk: int = CHUNK) -> Path:
    """Write `vectors` as the file `faiss.write_index` makes of an IndexFlatIP holding them, chunk by chunk
    (memory: one chunk), through a temporary file renamed into place. Returns `path`.
    """
    path = Path(path)
    n, dim = vectors.shape
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as fh:
        # tag, d, ntotal, two unused int64 (1 << 20 each, as faiss writes them), is_trained, metric 0 = IP
        fh.write(_FLAT_HEADER.pack(b"IxFI", dim, n, 1 << 20, 1 << 20, True, 0, n * dim))
        for start in range(0, n, chunk):
            fh.write(np.ascontiguousarray(vectors[start : start + chunk], dtype="<f4").tobytes())
    tmp.rename(path)
    return path


def load_vectors(path: str | os.PathLike) -> np.ndarray:
    """(n, dim) float32 vectors from a `.npy` file or a flat FAISS index file, memory-mapped."""
    path = Path(path)
    if path.suffix == ".npy":
        arr = np.load(path, mmap_mode="r")
        if arr.ndim != 2 or arr.dtype != np.float32:
            raise ValueError(f"{path}: expected a 2-D float32 array, got {arr.dtype} {arr.shape}")
        return arr
    return read_flat_index(path)


def encode_to_file(
    model: Any,
    texts: Callable[[int, int], list[str]],
    n: int,
    out: str | os.PathLike,
    *,
    batch_size: int = 64,
    chunk: int = 4096,
    progress: Callable[[str, int, int | None], None] | None = None,
) -> np.ndarray:
    """Encode `n` texts into a `.npy` file chunk by chunk (unit vectors); returns it memory-mapped.

    Args:
        model: a SentenceTransformer.
        texts: texts(start, end) -> the texts of passages start..end-1.
        n: the number of passages.
        out: the `.npy` file to write.
        batch_size: the encoder's batch.
        chunk: passages encoded and written per step (memory grows with it, not with `n`).
        progress: progress(stage, done, total).

    """
    dim = model.get_embedding_dimension() if hasattr(model, "get_embedding_dimension") else None
    dim = dim or model.get_sentence_embedding_dimension()
    arr = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(n, dim))
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        emb = model.encode(texts(start, end), batch_size=batch_size, normalize_embeddings=True)
        arr[start:end] = np.asarray(emb, dtype=np.float32).reshape(end - start, dim)
        if progress:
            progress("encoding", end, n)
    arr.flush()
    return np.load(out, mmap_mode="r")


def exact_top_k(queries: np.ndarray, vectors: np.ndarray, k: int, chunk: int = CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """Exact inner-product top-k of each query over `vectors`, scanned in chunks (memory: queries x chunk).

    Returns:
        (scores, ids), both (n_queries, k), best first; ties go to the lower id.

    """
    n = len(vectors)
    k = min(k, n)
    nq = len(queries)
    best_s = np.full((nq, 0), -np.inf, dtype=np.float32)
    best_i = np.zeros((nq, 0), dtype=np.int64)
    for start in range(0, n, chunk):
        block = np.asarray(vectors[start : start + chunk], dtype=np.float32)
        s = queries @ block.T
        kk = min(k, s.shape[1])
        part = np.argpartition(-s, kk - 1, axis=1)[:, :kk]
        _lowest_ids_at_the_kth(s, part)
        cand_s = np.concatenate([best_s, np.take_along_axis(s, part, axis=1)], axis=1)
        cand_i = np.concatenate([best_i, part + start], axis=1)
        order = np.lexsort((cand_i, -cand_s), axis=1)[:, :k]
        best_s = np.take_along_axis(cand_s, order, axis=1)
        best_i = np.take_along_axis(cand_i, order, axis=1)
    return best_s, best_i


def _lowest_ids_at_the_kth(scores: np.ndarray, part: np.ndarray) -> None:
    """Make each row of `part` (argpartition's kk best columns of `scores`) keep the lowest ids among the
    scores tied at its k-th: argpartition keeps an arbitrary few of them, which ones depending on numpy's
    SIMD code for the CPU. Only rows where such a tie straddles the cut are sorted again (rare).
    """
    kk = part.shape[1]
    picked = np.take_along_axis(scores, part, axis=1)
    kth = picked.min(axis=1, keepdims=True)
    straddling = np.flatnonzero((scores == kth).sum(axis=1) > (picked == kth).sum(axis=1))
    columns = np.arange(scores.shape[1])
    for row in straddling:
        part[row] = np.lexsort((columns, -scores[row]))[:kk]


def recall_at_k(approx_ids: np.ndarray, exact_ids: np.ndarray) -> float:
    """Mean fraction of each query's exact top-k found in its approximate top-k."""
    if len(exact_ids) == 0:
        return 1.0
    hits = [len(set(a.tolist()) & set(e.tolist())) / max(1, len(e)) for a, e in zip(approx_ids, exact_ids)]
    return float(np.mean(hits))
