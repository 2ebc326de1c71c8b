"""Every dense index kind over a corpus and FAISS file in the reference's layout, served on loopback.

The fixture writes what the reference downloads for wiki-18, at toy size: `wiki-18.jsonl` (Search-R1's
`contents` records) and `e5_Flat.index` (a FAISS IndexFlatIP of the passages' unit vectors, here MiniLM's).
"""

import json
import sys

import faiss
import numpy as np
import pytest
from search_helpers import PASSAGES

from drmas_envs.search.retrievers import HTTPRetriever, build_index, load_index
from drmas_envs.search.retrievers.ann import IVFPQConfig, ServeConfig
from drmas_envs.search.retrievers.dense import load_model, passage_text, resolve_encoder
from drmas_envs.search.retrievers.faiss_retriever import FaissRetriever
from drmas_envs.search.retrievers.rerank import FLAT_COPY, read_refine
from drmas_envs.search.world import generate_world
from drmas_retrieval import ServiceConfig
from drmas_retrieval.cli import main
from drmas_retrieval.server import serve_in_thread

RECORDS = [(p["id"], p["title"], p["text"]) for p in PASSAGES] + list(generate_world().passages[:95])
QUESTION = "Where was Marie Curie born?"


@pytest.fixture(scope="module")
def reference_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("wiki18")
    corpus = root / "wiki-18.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n" for i, (_, t, x) in enumerate(RECORDS))
    )
    spec = resolve_encoder("minilm")
    vecs = load_model(spec.model).encode([passage_text(spec, t, x) for _, t, x in RECORDS], normalize_embeddings=True)
    flat = faiss.IndexFlatIP(vecs.shape[1])
    flat.add(np.asarray(vecs, dtype=np.float32))
    faiss.write_index(flat, str(root / "e5_Flat.index"))
    return corpus, root / "e5_Flat.index"


def _served_titles(retriever, k=3):
    server, thread = serve_in_thread(retriever, ServiceConfig(port=0))  # a free port: tests run side by side
    try:
        hits = HTTPRetriever(server.url).search([QUESTION, "capital of Poland"], k)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    return [[p.title for p in row] for row in hits]


@pytest.mark.parametrize(
    "kind, options",
    [
        ("faiss", {"faiss_index": True}),  # the reference's file, read with faiss.read_index
        ("dense", {"vectors": True}),  # its vectors memory-mapped, exact search without faiss
        ("faiss", {"vectors": True, "ivfpq": IVFPQConfig(nlist=4, m=48, nbits=4, nprobe=4, min_passages=0)}),
        ("faiss", {"vectors": True, "ivfpq": IVFPQConfig(nlist=4, m=4, nbits=4, min_passages=0, shortlist=20)}),
    ],
    ids=["reference-file", "exact-over-file", "ivfpq-from-file", "reranked-from-file"],
)
def test_index_kinds_over_the_reference_layout_serve_on_loopback(reference_files, tmp_path, kind, options):
    corpus, flat = reference_files
    kw = {k: flat if v is True else v for k, v in options.items()}
    out = build_index(corpus, kind, tmp_path / "idx", **kw)
    retriever = load_index(out)
    assert len(retriever.store) == len(RECORDS)
    titles = _served_titles(retriever)
    assert titles[0][0] == "Marie Curie" and "Warsaw" in titles[1][:2], titles
    if "ivfpq" in options and not options["ivfpq"].shortlist:
        ivf = faiss.downcast_index(faiss.extract_index_ivf(retriever.index))
        assert (ivf.nlist, ivf.pq.M, ivf.pq.nbits, ivf.nprobe) == (4, 48, 4, 4)
        assert 0.0 < FaissRetriever.report(out).recall <= 1.0
    if "ivfpq" in options and options["ivfpq"].shortlist:  # 4-byte codes, re-ranked from the reference's file
        assert read_refine(out / "faiss") == {"vectors": str(flat.resolve()), "shortlist": 20}
        assert not (out / "faiss" / FLAT_COPY).exists() and retriever.shortlist == 20
        assert FaissRetriever.report(out).shortlist == 20
        wider = load_index(out, ServeConfig(shortlist=len(RECORDS)))  # every passage re-ranked: exact search
        exact = load_index(build_index(corpus, "dense", tmp_path / "exact", vectors=flat))
        assert [p.id for p in wider.search([QUESTION], 5)[0]] == [p.id for p in exact.search([QUESTION], 5)[0]]


def test_reranked_index_built_from_npy_vectors_carries_its_flat_copy(reference_files, tmp_path):
    corpus, flat = reference_files
    npy = tmp_path / "vectors.npy"
    np.save(npy, load_index(build_index(corpus, "dense", tmp_path / "exact", vectors=flat)).embeddings)
    cfg = IVFPQConfig(nlist=4, m=4, nbits=4, min_passages=0, shortlist=len(RECORDS))  # every passage re-ranked
    built = build_index(corpus, "faiss", tmp_path / "built", vectors=npy, ivfpq=cfg)
    moved = built.rename(tmp_path / "moved")  # the copy is named relative to the folder: it moves with it
    assert (moved / "faiss" / FLAT_COPY).read_bytes() == flat.read_bytes()
    exact = load_index(tmp_path / "exact").search([QUESTION, "capital of Poland"], 5)
    reranked = load_index(moved).search([QUESTION, "capital of Poland"], 5)
    assert [[p.id for p in row] for row in reranked] == [[p.id for p in row] for row in exact]


def test_vector_count_must_match_the_corpus(reference_files, tmp_path):
    corpus, flat = reference_files
    short = tmp_path / "short.jsonl"
    short.write_text("".join(corpus.read_text().splitlines(keepends=True)[:10]))
    with pytest.raises(ValueError, match=r"holds 100 vectors but the corpus has 10 passages"):
        build_index(short, "dense", tmp_path / "idx", vectors=flat)


def test_cli_builds_a_compressed_index_with_its_recall(reference_files, tmp_path, capsys):
    corpus, flat = reference_files
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"question": q}) + "\n" for q in [QUESTION, "Who was born in Ulm?"]))
    out = tmp_path / "idx"
    args = ["build", "--corpus", str(corpus), "--retriever", "faiss", "--vectors", str(flat), "--out", str(out)]
    main([*args, "--nlist", "4", "--nprobe", "4", "--min-passages", "0", "--recall-queries", str(questions)])
    printed = capsys.readouterr().out
    report = FaissRetriever.report(out)
    assert report.queries == "2 encoded queries" and f"recall@3 against exact search: {report.recall:.3f}" in printed
    assert "nprobe 4" in printed


def test_serving_options_the_index_cannot_honour_are_one_clear_error(reference_files, tmp_path, capsys):
    corpus, flat = reference_files
    out = build_index(corpus, "faiss", tmp_path / "idx", faiss_index=flat)
    missing = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0  # an id this machine lacks
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--index", str(out), "--gpus", str(missing), "--port", "0"])
    printed = capsys.readouterr().out.strip()
    assert exit_info.value.code == 2 and len(printed.splitlines()) == 1
    assert printed.startswith(f"error: --gpus {missing}: ") and ("CPU-only" in printed or "faiss sees" in printed)
    with pytest.raises(ValueError, match="not re-ranked; a shortlist needs one built with --shortlist"):
        load_index(out, ServeConfig(shortlist=100))
    with pytest.raises(ValueError, match=r"encoder device 'cuda:999': torch sees \d+ CUDA device"):
        load_index(out, ServeConfig(encoder_device="cuda:999"))


def test_cli_without_the_faiss_extra_says_what_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "faiss", None)  # what an install without drmas-envs[faiss] looks like
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "0", "contents": '"A"\nx'}) + "\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["build", "--corpus", str(corpus), "--retriever", "faiss", "--out", str(tmp_path / "idx")])
    assert exit_info.value.code == 2
    assert "pip install 'drmas-envs[faiss]'" in capsys.readouterr().out
    assert not (tmp_path / "idx").exists()
