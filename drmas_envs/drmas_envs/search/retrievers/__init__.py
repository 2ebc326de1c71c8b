"""Retrievers behind one interface: `search(queries, k) -> list[list[Passage]]`.

- `BM25Retriever` (bm25s, in-process; the default),
- `DenseRetriever` (sentence-transformers; imported lazily, so torch loads only when used),
- `HTTPRetriever` (a client of a retrieval service such as `drmas-retrieval serve`).
"""

from drmas_envs.search.retrievers.base import Passage, Retriever, split_contents
from drmas_envs.search.retrievers.bm25 import BM25Retriever
from drmas_envs.search.retrievers.http import HTTPRetriever, RetrievalServiceError
from drmas_envs.search.retrievers.index import (
    build_in_memory,
    build_index,
    cache_root,
    default_index_dir,
    get_retriever,
    load_index,
)
from drmas_envs.search.retrievers.store import DiskStore, MemoryStore, iter_corpus

__all__ = [
    "BM25Retriever",
    "DiskStore",
    "HTTPRetriever",
    "MemoryStore",
    "Passage",
    "RetrievalServiceError",
    "Retriever",
    "build_in_memory",
    "build_index",
    "cache_root",
    "default_index_dir",
    "get_retriever",
    "iter_corpus",
    "load_index",
    "split_contents",
]
