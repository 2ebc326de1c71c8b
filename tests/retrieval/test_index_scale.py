"""Retrieval at scale, small: the streamed BM25 build, vectors read in place, chunked exact search, IVF-PQ.

In tests/retrieval (with the service tests) because it needs the `faiss` extra, which the env tests at
drmas-envs' dependency floors (scripts/test_lowest_envs.sh) do not install.
"""

import json
import sys

import bm25s
import faiss
import numpy as np
import pytest
from search_helpers import PASSAGES

from drmas_envs.data import DataError
from drmas_envs.search.retrievers import BM25Retriever, MemoryStore, build_index
from drmas_envs.search.retrievers.ann import IVFPQConfig, build_ivfpq, measure_recall, set_nprobe
from drmas_envs.search.retrievers.bm25 import tokenize
from drmas_envs.search.retrievers.bm25_build import build_bm25_files
from drmas_envs.search.retrievers.faiss_lib import import_faiss
from drmas_envs.search.retrievers.vectors import exact_top_k, load_vectors, read_flat_index, recall_at_k
from drmas_envs.search.world import generate_world

RECORDS = [(p["id"], p["title"], p["text"]) for p in PASSAGES] + list(generate_world().passages)


def unit(rng, n, dim):
    v = rng.normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def clustered(n=3000, dim=32, centres=24, seed=0):
    """Unit vectors around a few centres: structure an IVF index can exploit, like real embeddings."""
    rng = np.random.default_rng(seed)
    c = unit(rng, centres, dim)
    v = c[rng.integers(0, centres, n)] + 0.35 * rng.normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_streamed_bm25_build_writes_bm25s_files_with_identical_scores(tmp_path):
    store = MemoryStore(RECORDS)
    calls = []
    # chunk 7: many chunks, so terms straddle chunk boundaries and columns are filled in several steps
    n = build_bm25_files(store, tmp_path / "bm25", tokenize, chunk=7, progress=lambda *a: calls.append(a))
    assert n == len(RECORDS)
    assert {stage for stage, _, _ in calls} == {"tokenising", "weighting"} and calls[-1] == ("weighting", n, n)
    streamed = BM25Retriever.load(tmp_path, store)
    reference = BM25Retriever.build(store)  # bm25s's own in-memory index
    for q in ["Marie Curie Warsaw", "city river founded", "clock tower", "unknownword"]:
        assert np.array_equal(streamed.scores(q), reference.scores(q)), q
        assert streamed.search([q], 5) == reference.search([q], 5)
    loaded = bm25s.BM25.load(tmp_path / "bm25", mmap=True)  # bm25s itself reads the files
    assert loaded.scores["num_docs"] == n and "" in loaded.vocab_dict


@pytest.mark.parametrize("index_cls", [faiss.IndexFlatIP, faiss.IndexFlatL2])
def test_flat_faiss_file_is_read_in_place(tmp_path, index_cls):
    vecs = unit(np.random.default_rng(1), 50, 16)
    flat = index_cls(16)
    flat.add(vecs)
    path = tmp_path / "e5_Flat.index"
    faiss.write_index(flat, str(path))
    mapped = load_vectors(path)
    assert isinstance(mapped, np.memmap) and np.array_equal(mapped, vecs)
    path.write_bytes(path.read_bytes()[:-4])  # a truncated download
    with pytest.raises(ValueError, match="partial download"):
        read_flat_index(path)
    path.write_bytes(b"not a faiss file at all, but long enough for a header")
    with pytest.raises(ValueError, match="not a flat FAISS index"):
        read_flat_index(path)


def test_exact_top_k_in_chunks_equals_a_full_sort():
    rng = np.random.default_rng(2)
    vecs, q = unit(rng, 1000, 24), unit(rng, 9, 24)
    # A tie: the same vector at the same row of two full chunks of 64, so its two scores come out of the same
    # computation bit for bit on any CPU (a whole-matrix product may round them apart); the lower id comes first.
    vecs[458] = vecs[10]
    q[0] = vecs[10]
    scores, ids = exact_top_k(q, vecs, 5, chunk=64)
    # The expected order from the same chunked products, sorted whole (not the function's running merge).
    full = np.concatenate([q @ vecs[start : start + 64].T for start in range(0, 1000, 64)], axis=1)
    expected = np.lexsort((np.broadcast_to(np.arange(1000), full.shape), -full), axis=1)[:, :5]
    assert np.array_equal(ids, expected) and ids[0, 0] == 10 and ids[0, 1] == 458
    assert np.array_equal(scores, np.take_along_axis(full, expected, axis=1))
    assert recall_at_k(np.array([[1, 2, 3]]), np.array([[3, 4, 1]])) == pytest.approx(2 / 3)


def test_exact_top_k_keeps_the_lowest_ids_of_a_tie_at_the_kth_score():
    """Nine copies of one vector, k = 4: the tie straddles the cut, and the four lowest ids are kept (numpy's
    argpartition keeps an arbitrary four, which ones depending on its SIMD code for the CPU)."""
    rng = np.random.default_rng(0)
    vecs = unit(rng, 300, 8)
    vecs[[5, 40, 77, 120, 150, 199, 250, 260]] = vecs[3]
    q = vecs[3:4].copy()
    for chunk in (300, 64):
        scores, ids = exact_top_k(q, vecs, 4, chunk=chunk)
        # the expected order from the same chunked products, so the tie is whatever they make of it
        full = np.concatenate([q @ vecs[start : start + chunk].T for start in range(0, 300, chunk)], axis=1)
        expected = np.lexsort((np.arange(300), -full[0]))[:4]
        assert ids[0].tolist() == expected.tolist(), chunk
        assert np.array_equal(scores[0], full[0, expected])


def test_ivfpq_is_built_in_chunks_and_its_recall_measured():
    vecs = clustered()
    cfg = IVFPQConfig(nlist=16, m=8, nprobe=4, train_size=1500, chunk=500)
    stages = []
    index = build_ivfpq(vecs, cfg, progress=lambda s, d, t: stages.append((s, d)))
    assert index.ntotal == len(vecs) and [d for s, d in stages if s == "adding"] == [500, 1000, 1500, 2000, 2500, 3000]
    queries = clustered(n=100, seed=3)
    low = measure_recall(index, vecs, 3, queries, cfg)
    set_nprobe(index, 16)  # every cluster: only the quantisation error is left
    high = measure_recall(index, vecs, 3, queries, cfg)
    assert (low.nlist, low.m, low.nprobe, high.nprobe) == (16, 8, 4, 16)
    assert 0.3 < low.recall <= high.recall <= 1.0
    noisy = measure_recall(index, vecs, 3, None, cfg)  # build-time default: noisy indexed vectors
    assert noisy.queries.endswith("indexed vectors plus noise") and noisy.recall > 0.3


def test_missing_faiss_extra_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)  # what an install without the extra looks like
    with pytest.raises(ImportError, match=r"pip install 'drmas-envs\[faiss\]'"):
        import_faiss()


def test_malformed_reference_corpus_line_names_file_and_line(tmp_path):
    corpus = tmp_path / "wiki-18.jsonl"
    lines = [json.dumps({"id": "0", "contents": '"A"\nfirst'}), json.dumps({"id": "1", "title": "no body"})]
    corpus.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"{corpus}:2: a passage needs"):
        build_index(corpus, "faiss", tmp_path / "idx", vectors=tmp_path / "unused.npy")
    corpus.write_text(lines[0] + "\n{broken\n")
    with pytest.raises(DataError, match=rf"{corpus}:2: not valid JSON"):
        build_index(corpus, "bm25", tmp_path / "idx")
    assert not (tmp_path / "idx").exists()
