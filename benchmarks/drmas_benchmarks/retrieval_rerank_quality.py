"""Quality of re-ranked retrieval (`retrieval_rerank.py`): recall against exact search, and answer hits@3.

recall_grid: recall@3 and @10 of the re-ranked index (IVF-PQ shortlist, exact float32 re-scoring) against exact
search over the same vectors, per nprobe x shortlist, and of plain IVF-PQ per nprobe; and, searching every
cluster, the shortlist each query would need: the rank IVF-PQ alone gives the last of its exact top 3.
hits: hit@3 on real questions whose answer is in the corpus, for exact, re-ranked and plain compressed search.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from drmas_benchmarks.retrieval_scale_data import DATA
from drmas_benchmarks.service_load import questions

NPROBES = (16, 32, 64, 128, 256, 512)
SHORTLISTS = (50, 100, 200, 500, 1000)


def _encode(texts: list[str]) -> np.ndarray:
    from drmas_envs.search.retrievers.dense import encode_queries, load_model, resolve_encoder

    spec = resolve_encoder("minilm")
    return encode_queries(load_model(spec.model), spec, texts)


def _indexes(index_dir: Path) -> tuple:
    import faiss

    from drmas_envs.search.retrievers.rerank import open_flat, read_refine, reranked

    base = faiss.read_index(str(index_dir / "faiss" / "index.faiss"))
    refine = read_refine(index_dir / "faiss")
    return base, reranked(base, open_flat(refine["vectors"]), refine["shortlist"])


def recall_grid(index_dir: Path, vectors: Path, n_queries: int) -> dict:
    import faiss

    from drmas_envs.search.retrievers.ann import set_nprobe
    from drmas_envs.search.retrievers.rerank import search
    from drmas_envs.search.retrievers.vectors import exact_top_k, load_vectors, recall_at_k

    q = _encode(questions(n_queries))
    _, exact = exact_top_k(q, load_vectors(vectors), 10)
    base, index = _indexes(index_dir)
    ivf = faiss.downcast_index(base)
    out: dict = {"queries": len(q), "nlist": ivf.nlist, "pq_bytes": ivf.pq.M, "compressed": {}, "reranked": {}}
    for nprobe in [p for p in NPROBES if p <= ivf.nlist]:
        set_nprobe(base, nprobe)
        _, plain = base.search(q, 10)
        out["compressed"][nprobe] = {"recall_at_3": recall_at_k(plain[:, :3], exact[:, :3]),
                                     "recall_at_10": recall_at_k(plain, exact)}  # fmt: skip
        for shortlist in SHORTLISTS:
            t = time.perf_counter()
            _, ids = search(index, q, 10, shortlist)
            took = time.perf_counter() - t
            _, ids3 = search(index, q, 3, shortlist)
            out["reranked"][f"{nprobe}/{shortlist}"] = {
                "nprobe": nprobe,
                "shortlist": shortlist,
                "recall_at_3": recall_at_k(ids3, exact[:, :3]),
                "recall_at_10": recall_at_k(ids, exact),
                "search_ms_per_query": took / len(q) * 1e3,  # batched, warm page cache, no encoding
            }
    set_nprobe(base, ivf.nlist)  # every cluster: where IVF-PQ alone ranks the exact top 3
    _, ranked = base.search(q, max(SHORTLISTS))
    worst = [max((list(r).index(i) + 1 if i in r else max(SHORTLISTS) + 1) for i in e) for r, e in
             zip(ranked.tolist(), exact[:, :3].tolist())]  # fmt: skip
    out["pq_rank_of_exact_top3"] = {f"p{p}": float(np.percentile(worst, p)) for p in (50, 90, 99, 100)}
    return out


def _answers_in(passages: list[str], golds: list[str]) -> bool:
    from drmas_envs.search.metrics import normalize_answer

    norm = [normalize_answer(g) for g in golds if normalize_answer(g)]
    return any(g in p for g in norm for p in passages)


def _real_questions(corpus: Path) -> dict[str, list[tuple[str, list[str]]]]:
    """HotpotQA dev-with-context questions (gold answers in their supporting paragraphs; yes/no dropped) and
    NQ test-1000 questions whose answer string is in some passage of the corpus."""
    from drmas_envs.search.metrics import normalize_answer

    hotpot = []
    for line in open(DATA / "search" / "hotpotqa_dev_with_context.jsonl"):
        item = json.loads(line)
        if normalize_answer(item["golden_answers"][0]) not in {"yes", "no"}:
            hotpot.append((item["question"], item["golden_answers"]))
    texts = []
    with open(corpus) as fh:
        for line in fh:
            rec = json.loads(line)
            texts.append(normalize_answer(f"{rec['title']} {rec['text']}"))
    everything = "\n".join(texts)
    nq = []
    for line in open(DATA / "search" / "nq_test_1000.jsonl"):
        item = json.loads(line)
        golds = [normalize_answer(g) for g in item["golden_answers"]]
        if any(g and g in everything for g in golds):
            nq.append((item["question"], item["golden_answers"]))
    return {"hotpotqa_dev_with_context": hotpot, "nq_test_1000": nq}


def hits(index_dir: Path, vectors: Path, corpus: Path, nprobe: int, shortlist: int, limit: int = 0) -> dict:
    """hit@3 per question set: exact search, and re-ranked (`shortlist`) and plain IVF-PQ at the served `nprobe`
    and at the smaller NPROBES; `limit`: the first this many questions of each set (0: all)."""
    from drmas_envs.search.metrics import normalize_answer
    from drmas_envs.search.retrievers.ann import set_nprobe
    from drmas_envs.search.retrievers.rerank import search
    from drmas_envs.search.retrievers.store import DiskStore
    from drmas_envs.search.retrievers.vectors import exact_top_k, load_vectors

    store = DiskStore(index_dir)
    base, index = _indexes(index_dir)
    out: dict = {"nprobe": nprobe, "shortlist": shortlist}
    for name, items in _real_questions(corpus).items():
        items = items[:limit] if limit else items
        q = _encode([question for question, _ in items])
        exact = exact_top_k(q, load_vectors(vectors), 3)[1]

        def hit(ids: np.ndarray, items: list = items) -> float:
            passages = ([normalize_answer(" ".join(store.get(int(i))[1:])) for i in top if i >= 0] for top in ids)
            return float(np.mean([_answers_in(p, golds) for p, (_, golds) in zip(passages, items)]))

        row: dict = {"questions": len(items), "exact": hit(exact), "by_nprobe": {}}
        for probe in sorted({p for p in NPROBES if p < nprobe and p >= 32} | {nprobe}):
            set_nprobe(base, probe)
            reranked = search(index, q, 3, shortlist)[1]
            same = [set(a) == set(b) for a, b in zip(reranked.tolist(), exact.tolist())]
            row["by_nprobe"][probe] = {"reranked": hit(reranked), "compressed": hit(base.search(q, 3)[1]),
                                       "reranked_same_top3_as_exact": float(np.mean(same))}  # fmt: skip
        row.update(row["by_nprobe"][nprobe])
        out[name] = row
    return out
