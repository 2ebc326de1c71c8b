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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from drmas_envs.search.retrievers.ann import IVFPQConfig, ServeConfig
from drmas_envs.search.retrievers.base import Retriever
from drmas_envs.search.retrievers.bm25 import BM25Retriever
from drmas_envs.search.retrievers.bm25_build import Progress
from drmas_envs.search.retrievers.http import HTTPRetriever
from drmas_envs.search.retrievers.store import DiskStore, MemoryStore, Record, iter_corpus

logger = logging.getLogger(__name__)

KINDS = ("bm25", "dense", "faiss")
FORMATS = {"bm25": 2, "dense": 1, "faiss": 1}
"""Index format versions; a change makes cached indexes rebuild (bm25 2: the NLTK stopword list)."""
DENSE_KINDS = ("dense", "faiss")
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
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}|{kind}|{encoder if kind in DENSE_KINDS else ''}|{FORMATS[kind]}"
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    return cache_root() / "indexes" / f"{path.name.split('.')[0]}-{kind}-{digest}"


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown retriever {kind!r}; use one of {KINDS} or an http:// URL")


def build_in_memory(records: list[Record], kind: str, *, encoder: str = "minilm") -> Retriever:
    """A retriever over passages held in memory (nothing written)."""
    _check_kind(kind)
    if kind == "faiss":
        raise ValueError("a FAISS index is built into a folder: use build_index (or retriever='dense' in memory)")
    store = MemoryStore(records)
    if kind == "bm25":
        return BM25Retriever.build(store)
    from drmas_envs.search.retrievers.dense import DenseRetriever

    return DenseRetriever.build(store, encoder=encoder)


def _build_kind(kind: str, store: DiskStore, tmp: Path, encoder: str, progress: Progress | None, **options: Any) -> Any:
    if kind == "bm25":
        return BM25Retriever.build_on_disk(store, tmp, progress=progress)
    if kind == "dense":
        from drmas_envs.search.retrievers.dense import DenseRetriever

        return DenseRetriever.build_on_disk(
            store, tmp, encoder=encoder, vectors=options.get("vectors"), progress=progress
        )
    from drmas_envs.search.retrievers.faiss_retriever import FaissRetriever

    return FaissRetriever.build_on_disk(store, tmp, encoder=encoder, progress=progress, **options)


def build_index(
    corpus: str | os.PathLike,
    kind: str,
    out: str | os.PathLike,
    *,
    encoder: str = "minilm",
    vectors: str | os.PathLike | None = None,
    faiss_index: str | os.PathLike | None = None,
    ivfpq: IVFPQConfig | None = None,
    recall_queries: list[str] | None = None,
    progress: Progress | None = None,
) -> Path:
    """Build the index of a JSONL(.gz) corpus into `out`; written to a temp folder and renamed into place.

    Args:
        corpus: JSONL(.gz) passages (`id`, `title`, `text`, or Search-R1's `contents`), in vector order.
        kind: "bm25", "dense" (exact search over vectors) or "faiss" (a FAISS index).
        out: the index folder.
        encoder: the dense encoder ("minilm", "e5", a path or a hub id); "e5" for the reference's vectors.
        vectors: dense/faiss: existing vectors (`.npy` or a flat FAISS file), used instead of encoding.
        faiss_index: faiss: an existing FAISS file served as is (e.g. e5_Flat.index; not copied).
        ivfpq: faiss: the compressed index's build settings.
        recall_queries: faiss: questions to measure the compressed index's recall against exact search.
        progress: progress(stage, done, total), for a progress bar.

    Returns:
        `out`. If another process finished the same folder first, its index is kept.

    """
    _check_kind(kind)
    if kind == "bm25" and (vectors or faiss_index):
        raise ValueError("vectors / faiss_index are for the dense and faiss retrievers, not bm25")
    if kind == "dense" and faiss_index:
        raise ValueError("to serve a FAISS file as is use retriever 'faiss'; 'dense' takes it as vectors=")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        start = time.perf_counter()
        n = DiskStore.write(_counted(iter_corpus(corpus), progress), tmp)
        store = DiskStore(tmp)
        options: dict[str, Any] = {"vectors": vectors}
        if kind == "faiss":
            options.update(faiss_index=faiss_index, config=ivfpq, recall_queries=recall_queries)
        retriever = _build_kind(kind, store, tmp, encoder, progress, **options)
        retriever.save(tmp)
        del retriever, store  # release the memory maps before the folder is renamed
        meta = {"format": FORMATS[kind], "retriever": kind, "n_passages": n, "corpus": str(corpus), "encoder": encoder}
        meta.update({k: str(v) for k, v in (("vectors", vectors), ("faiss_index", faiss_index)) if v})
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


def _counted(records: Iterator[Record], progress: Progress | None) -> Iterator[Record]:
    for i, rec in enumerate(records, 1):
        if progress and i % 50_000 == 0:
            progress("reading corpus", i, None)
        yield rec


def load_index(directory: str | os.PathLike, serve: ServeConfig | None = None) -> Retriever:
    """Load an index folder written by `build_index` (memory-mapped; a FAISS index is read whole, the
    vectors of a re-ranked one memory-mapped).

    Args:
        directory: the index folder.
        serve: dense indexes: the encoder's device; faiss: nprobe, shortlist, GPUs (default: as built, CPU).

    """
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
    serve = serve or ServeConfig()
    if kind != "faiss" and (serve.nprobe or serve.shortlist or serve.gpus):
        raise ValueError(f"{directory} holds a {kind} index: nprobe, shortlist and gpus apply to faiss indexes")
    store = DiskStore(directory)
    if kind == "bm25":
        return BM25Retriever.load(directory, store)
    if kind == "faiss":
        from drmas_envs.search.retrievers.faiss_retriever import FaissRetriever

        return FaissRetriever.load(directory, store, serve)
    from drmas_envs.search.retrievers.dense import DenseRetriever

    return DenseRetriever.load(directory, store, serve.encoder_device)


@functools.lru_cache(maxsize=16)
def get_retriever(
    spec: str,
    corpus: str | None = None,
    *,
    index_dir: str | None = None,
    encoder: str = "minilm",
    timeout: float = 30.0,
    retries: int = 3,
) -> Retriever:
    """A retriever by spec, cached: repeated calls with the same arguments return the same object.

    Args:
        spec: "bm25", "dense", "faiss" (compressed IVF-PQ from 10,000 passages), or a service URL "http://host:port".
        corpus: a JSONL(.gz) corpus file (ignored for URLs).
        index_dir: where the corpus's index lives or is built; default: a folder under `cache_root()`.
        encoder: the dense encoder ("minilm", "e5", a path or a hub id).
        timeout: seconds per request to a service.
        retries: extra attempts per request to a service (`HTTPRetriever`).

    """
    if spec.startswith(("http://", "https://")):
        return HTTPRetriever(spec, timeout=timeout, retries=retries)
    _check_kind(spec)
    if corpus is None:
        raise ValueError(f"retriever {spec!r} needs a corpus file (corpus=...)")
    out = Path(index_dir) if index_dir else default_index_dir(corpus, spec, encoder)
    if not (out / "meta.json").is_file():
        build_index(corpus, spec, out, encoder=encoder)
    return load_index(out)
