"""Index directories: build once (atomically), load many times; and the cached `get_retriever`.

An index directory holds `meta.json`, the passage store (`passages.jsonl` + `offsets.npy`) and the
retriever's own files (`bm25/` or `dense/`). `drmas-retrieval build` writes the same layout, so an
index built for the service also loads in-process, and the other way round.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from drmas_envs.search.retrievers.base import Retriever
from drmas_envs.search.retrievers.bm25 import BM25Retriever
from drmas_envs.search.retrievers.http import HTTPRetriever
from drmas_envs.search.retrievers.store import DiskStore, MemoryStore, Record, iter_corpus

logger = logging.getLogger(__name__)

KINDS = ("bm25", "dense")
FORMATS = {"bm25": 2, "dense": 1}
"""Index format versions; a change makes cached indexes rebuild (bm25 2: the NLTK stopword list)."""
CACHE_ENV = "DRMAS_CACHE_DIR"
"""Environment variable naming the directory where indexes of corpus files are cached."""


def cache_root() -> Path:
    """$DRMAS_CACHE_DIR, else ~/.cache/drmas."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "drmas")


def default_index_dir(corpus: str | os.PathLike, kind: str, encoder: str = "minilm") -> Path:
    """The cache folder of `corpus`'s index; the key changes when the file (path, size, mtime) does."""
    _check_kind(kind)
    path = Path(corpus).resolve()
    st = path.stat()
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}|{kind}|{encoder if kind == 'dense' else ''}|{FORMATS[kind]}"
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    return cache_root() / "indexes" / f"{path.name.split('.')[0]}-{kind}-{digest}"


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown retriever {kind!r}; use one of {KINDS} or an http:// URL")


def build_in_memory(records: list[Record], kind: str, *, encoder: str = "minilm") -> Retriever:
    """A retriever over passages held in memory (nothing written)."""
    _check_kind(kind)
    store = MemoryStore(records)
    if kind == "bm25":
        return BM25Retriever.build(store)
    from drmas_envs.search.retrievers.dense import DenseRetriever

    return DenseRetriever.build(store, encoder=encoder)


def build_index(corpus: str | os.PathLike, kind: str, out: str | os.PathLike, *, encoder: str = "minilm") -> Path:
    """Build the index of a JSONL(.gz) corpus into `out`; written to a temp folder and renamed into place.

    Returns:
        `out`. If another process finished the same folder first, its index is kept.

    """
    _check_kind(kind)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        start = time.perf_counter()
        n = DiskStore.write(iter_corpus(corpus), tmp)
        store = DiskStore(tmp)
        if kind == "bm25":
            retriever = BM25Retriever.build(store)
        else:
            from drmas_envs.search.retrievers.dense import DenseRetriever

            retriever = DenseRetriever.build(store, encoder=encoder)
        retriever.save(tmp)
        meta = {"format": FORMATS[kind], "retriever": kind, "n_passages": n, "corpus": str(corpus), "encoder": encoder}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        logger.info("built %s index of %d passages in %.1f s", kind, n, time.perf_counter() - start)
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / "meta.json").is_file():
                raise
            logger.info("index %s was built concurrently; keeping that one", out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_index(directory: str | os.PathLike) -> Retriever:
    """Load an index folder written by `build_index` (memory-mapped)."""
    directory = Path(directory)
    meta_file = directory / "meta.json"
    if not meta_file.is_file():
        raise FileNotFoundError(f"{directory} is not an index folder (no meta.json); build one first")
    meta = json.loads(meta_file.read_text())
    kind = meta.get("retriever")
    _check_kind(kind)
    if meta.get("format") != FORMATS[kind]:
        raise ValueError(
            f"{directory} holds a {kind} index of format {meta.get('format')}; this version reads "
            f"format {FORMATS[kind]}: rebuild it (drmas-retrieval build, or delete the folder)"
        )
    store = DiskStore(directory)
    if kind == "bm25":
        return BM25Retriever.load(directory, store)
    from drmas_envs.search.retrievers.dense import DenseRetriever

    return DenseRetriever.load(directory, store)


@functools.lru_cache(maxsize=16)
def get_retriever(
    spec: str,
    corpus: str | None = None,
    *,
    index_dir: str | None = None,
    encoder: str = "minilm",
    timeout: float = 30.0,
) -> Retriever:
    """A retriever by spec, cached: repeated calls with the same arguments return the same object.

    Args:
        spec: "bm25", "dense", or a service URL "http://host:port".
        corpus: a JSONL(.gz) corpus file (ignored for URLs).
        index_dir: where the corpus's index lives or is built; default: a folder under `cache_root()`.
        encoder: the dense encoder ("minilm", "e5", a path or a hub id).
        timeout: seconds per request to a service.

    """
    if spec.startswith(("http://", "https://")):
        return HTTPRetriever(spec, timeout=timeout)
    _check_kind(spec)
    if corpus is None:
        raise ValueError(f"retriever {spec!r} needs a corpus file (corpus=...)")
    out = Path(index_dir) if index_dir else default_index_dir(corpus, spec, encoder)
    if not (out / "meta.json").is_file():
        build_index(corpus, spec, out, encoder=encoder)
    return load_index(out)
