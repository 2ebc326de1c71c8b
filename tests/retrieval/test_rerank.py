"""Re-ranking a compressed index's shortlist from float32 vectors memory-mapped off disk, and flat shards.

Real faiss, real files: the vectors are flat FAISS files in the reference's `e5_Flat.index` layout.
"""

from pathlib import Path

import faiss
import numpy as np
import pytest

from drmas_envs.search.retrievers.ann import IVFPQConfig, ServeConfig, build_ivfpq, set_nprobe
from drmas_envs.search.retrievers.gpu import gpu_flat, shard_bounds, sharded_flat
from drmas_envs.search.retrievers.rerank import open_flat, refine_vectors, reranked, search
from drmas_envs.search.retrievers.vectors import exact_top_k, write_flat_index


def clustered(n, dim, centres, seed):
    """Unit vectors around a few centres (structure like real embeddings: close neighbours, PQ errors matter)."""
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centres, dim)).astype(np.float32)
    v = c[rng.integers(0, centres, n)] + 0.6 * rng.normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """3,000 vectors in a reference-layout flat file, a coarse IVF-PQ index of them, and queries."""
    vecs = clustered(3000, 32, 24, seed=0)
    path = tmp_path_factory.mktemp("flat") / "e5_Flat.index"
    flat = faiss.IndexFlatIP(32)
    flat.add(vecs)
    faiss.write_index(flat, str(path))  # what the reference downloads, at toy size
    base = build_ivfpq(vecs, IVFPQConfig(nlist=16, m=16, nbits=4, nprobe=16, train_size=3000))
    return vecs, path, base, clustered(64, 32, 24, seed=1)


def test_reranked_results_equal_exact_search_when_the_shortlist_holds_the_true_top_k(indexed):
    vecs, path, base, queries = indexed
    k, shortlist = 5, 40
    exact_s, exact_i = exact_top_k(queries, vecs, k)
    _, compressed = base.search(queries, k)
    _, candidates = base.search(queries, shortlist)
    index = reranked(base, open_flat(path), shortlist)
    scores, ids = search(index, queries, k, shortlist)
    held = [set(e) <= set(c) for e, c in zip(exact_i.tolist(), candidates.tolist())]
    assert sum(held) >= len(queries) // 2  # the case under test occurs often enough to mean something
    assert not np.array_equal(compressed, exact_i)  # the PQ scores alone get the top k wrong
    for i in np.flatnonzero(held):
        assert ids[i].tolist() == exact_i[i].tolist(), i
        np.testing.assert_allclose(scores[i], exact_s[i], rtol=0, atol=1e-5)
    for i in np.flatnonzero(~np.array(held)):  # otherwise: still the best of the shortlist, exactly scored
        np.testing.assert_allclose(scores[i], vecs[ids[i]] @ queries[i], rtol=0, atol=1e-5)
    everything = search(index, queries, k, len(vecs))[1]  # a shortlist of every passage is exact search
    assert np.array_equal(everything, exact_i)


def test_the_shortlist_is_what_the_compressed_index_proposes(indexed):
    vecs, path, base, queries = indexed
    index = reranked(base, open_flat(path), 40)
    for shortlist in (3, 7, 40):  # the k factor gives exactly `shortlist` candidates (not one fewer)
        _, candidates = base.search(queries, shortlist)
        _, ids = search(index, queries, 3, shortlist)
        assert all(set(r) <= set(c) for r, c in zip(ids.tolist(), candidates.tolist())), shortlist
    set_nprobe(index, 2)  # the base index's nprobe is reached through the wrapper
    assert faiss.extract_index_ivf(base).nprobe == 2
    set_nprobe(index, 16)


def test_the_vectors_are_memory_mapped_from_the_reference_layout_not_loaded(tmp_path):
    n, dim = 16_000, 256  # 16 MB of float32
    vecs = np.random.default_rng(3).standard_normal((n, dim), dtype=np.float32)
    path = write_flat_index(vecs, tmp_path / "e5_Flat.index")
    del vecs
    anon = status_kib("RssAnon")
    flat = open_flat(path)
    flat.search(np.ones((1, dim), dtype=np.float32), 3)  # a flat search reads every vector
    grown = status_kib("RssAnon") - anon
    size_kib = path.stat().st_size // 1024
    assert grown < size_kib // 4, (grown, size_kib)  # the vectors are file pages (page cache), not anonymous
    assert str(path) in Path("/proc/self/maps").read_text()  # the file itself is mapped


def test_a_flat_copy_is_written_only_when_the_vectors_are_not_a_flat_ip_file(indexed, tmp_path):
    vecs, path, _, _ = indexed
    assert refine_vectors(vecs, path, tmp_path) == path.resolve()  # the reference's file: used in place
    npy = tmp_path / "v.npy"
    np.save(npy, vecs)
    copy = refine_vectors(np.load(npy, mmap_mode="r"), npy, tmp_path)
    assert copy.parent == tmp_path and copy.read_bytes() == path.read_bytes()  # what faiss.write_index makes
    l2 = faiss.IndexFlatL2(32)
    l2.add(vecs)
    faiss.write_index(l2, str(tmp_path / "l2.index"))
    with pytest.raises(ValueError, match="L2 flat index"):
        open_flat(tmp_path / "l2.index")


@pytest.mark.parametrize("parts", [1, 3, 4])
def test_sharded_flat_search_equals_one_flat_index(indexed, parts):
    vecs, _, _, queries = indexed
    one = faiss.IndexFlatIP(vecs.shape[1])
    one.add(vecs)
    q = queries[:8]  # under faiss's BLAS threshold: the same per-vector products in both
    expected_s, expected_i = one.search(q, 10)
    shards = sharded_flat(vecs, parts, chunk=700)  # chunks straddle shard edges
    assert shards.ntotal == len(vecs) and shards.count() == parts
    scores, ids = shards.search(q, 10)
    assert np.array_equal(ids, expected_i)
    np.testing.assert_allclose(scores, expected_s, rtol=0, atol=1e-6)
    assert shard_bounds(10, 3) == [(0, 3), (3, 6), (6, 10)]


def test_gpu_shards_on_a_machine_without_that_gpu_are_one_clear_error(indexed):
    vecs = indexed[0]
    missing = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0  # the first id faiss does not see
    with pytest.raises(ValueError, match=rf"^--gpus {missing}: this faiss .* is CPU-only|faiss sees") as err:
        gpu_flat(vecs, [missing])
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="distinct GPU ids"):
        ServeConfig(gpus=(0, 0))
    with pytest.raises(ValueError, match="nprobe and shortlist do not apply"):
        ServeConfig(gpus=(0,), shortlist=100)
