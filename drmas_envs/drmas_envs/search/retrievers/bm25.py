"""BM25 retrieval: a bm25s index (built once, saved as .npy files, memory-mapped on load), scored here.

bm25s precomputes every (term, passage) BM25 weight into a sparse matrix with one column per term.
A query's scores are then the sum of its terms' columns. We do that sum ourselves in numpy (one
float32 scatter-add per query term, then a top-k pick): faster than `bm25s.BM25.retrieve` with its
numpy backend (docs/retrieval.md) and with no numba. The scores equal bm25s's own.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import bm25s
import numpy as np
from bm25s.stopwords import STOPWORDS_EN_PLUS

from drmas_envs.search.retrievers.base import Passage
from drmas_envs.search.retrievers.bm25_build import Progress, build_bm25_files
from drmas_envs.search.retrievers.store import PassageStore

logger = logging.getLogger(__name__)

_WORD = re.compile(r"\w+")
_STOP = frozenset(STOPWORDS_EN_PLUS)  # the NLTK English list: question words ("which", "was") carry no signal
INDEX_SUBDIR = "bm25"
_ARGMAX_K = 16  # up to this k, k argmax passes beat one argpartition over the whole score array


def tokenize(text: str) -> list[str]:
    """Lowercased word tokens without English stopwords (the same for passages and queries)."""
    return [t for t in _WORD.findall(text.lower()) if t not in _STOP]


def top_k(scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k best (index, score) with score > 0, best first; ties go to the lower index.

    Overwrites `scores` (a scratch array).
    """
    if k <= _ARGMAX_K:
        out = []
        for _ in range(k):
            i = int(scores.argmax())
            if scores[i] <= 0.0:
                break
            out.append((i, float(scores[i])))
            scores[i] = -np.inf
        return out
    k = min(k, len(scores))
    kth = scores[np.argpartition(-scores, k - 1)[:k]].min()
    above = np.flatnonzero(scores > kth)  # argpartition breaks ties at the k-th score arbitrarily: redo them
    cand = np.concatenate([above, np.flatnonzero(scores == kth)[: k - len(above)]])
    cand = cand[np.lexsort((cand, -scores[cand]))]
    return [(int(i), float(scores[i])) for i in cand if scores[i] > 0.0]


class BM25Retriever:
    """Top-k BM25 over a passage store.

    Args:
        index: a fitted (or loaded) `bm25s.BM25`.
        store: the passages, in index order.

    Passages with score 0 (no query term in common) are not returned, so a query of unknown
    words gets an empty list rather than arbitrary passages.

    """

    def __init__(self, index: bm25s.BM25, store: PassageStore):
        self.index = index
        self.store = store
        self._data = index.scores["data"]
        self._indices = index.scores["indices"]
        self._indptr = index.scores["indptr"]
        self._n = int(index.scores["num_docs"])
        self._vocab = index.vocab_dict

    @classmethod
    def build(cls, store: PassageStore, *, k1: float = 1.5, b: float = 0.75) -> BM25Retriever:
        """Index every passage (title and text) of `store`."""
        tokens = [tokenize(f"{title} {text}") for _, title, text in store]
        index = bm25s.BM25(k1=k1, b=b)
        index.index(tokens, show_progress=False)
        return cls(index, store)

    @classmethod
    def build_on_disk(
        cls, store: PassageStore, directory: str | os.PathLike, *, progress: Progress | None = None
    ) -> BM25Retriever:
        """Index `store` straight into `directory`/bm25 in streamed chunks (memory bounded by the index,
        not the corpus), then memory-map it; `save` is then not needed.
        """
        build_bm25_files(store, Path(directory) / INDEX_SUBDIR, tokenize, progress=progress)
        return cls.load(directory, store)

    def save(self, directory: str | os.PathLike) -> None:
        """Write the index under `directory`/bm25 (the store is saved by the caller)."""
        if Path(directory, INDEX_SUBDIR, "params.index.json").is_file():
            return  # built there by `build_on_disk`
        self.index.save(Path(directory) / INDEX_SUBDIR, show_progress=False)

    @classmethod
    def load(cls, directory: str | os.PathLike, store: PassageStore) -> BM25Retriever:
        """Memory-map an index saved by `save`."""
        index = bm25s.BM25.load(Path(directory) / INDEX_SUBDIR, mmap=True, show_progress=False)
        return cls(index, store)

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every passage for `query` (float32, one per passage)."""
        out = np.zeros(self._n, dtype=np.float32)
        for token in tokenize(query):
            t = self._vocab.get(token)
            if t is not None:
                start, end = self._indptr[t], self._indptr[t + 1]
                out[self._indices[start:end]] += self._data[start:end]  # a term lists each passage once
        return out

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """One list of at most `k` passages per query, best first."""
        k = min(int(k), len(self.store))
        if k <= 0:
            return [[] for _ in queries]
        return [[Passage(*self.store.get(i), s) for i, s in top_k(self.scores(q), k)] for q in queries]
