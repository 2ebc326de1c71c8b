"""BM25 speed on a 100k-passage corpus: drmas (bm25s) one by one and batched, against rank-bm25.

The corpus: the 32,717 real passages of ../shared/data/corpus/wiki_passages.jsonl.gz, then perturbed
copies until there are 100,000: copy c of passage i replaces 20% of its words, at random (seed 0), by
words drawn from the corpus's own word list, and gets the title "<title> (<c>)". So passage length,
vocabulary and term statistics stay realistic. Queries: HotpotQA dev questions
(../shared/data/search/hotpotqa_dev.jsonl). Every figure is top-3, end to end through
`BM25Retriever.search` (tokenising, scoring, building Passage objects). rank-bm25 is timed on a small
sample of the same queries (it scores every passage for each query), with the same tokeniser,
`get_scores` + top-3.
Each library runs in its own subprocess so that build memory (RSS growth) is measured cleanly.

    .venv/bin/python -m drmas_benchmarks.retrieval_speed [--n-passages 100000] [--queries 1000] [--rank-queries 20]

Writes benchmarks/results/retrieval_speed.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("DRMAS_DATA_DIR") or ROOT.parent / "shared" / "data")
OUT = ROOT / "benchmarks" / "results" / "retrieval_speed.md"


def synth_corpus(path: Path, n: int) -> None:
    """Write the real passages, then perturbed copies, up to `n` (see the module docstring)."""
    from drmas_envs.search.retrievers import iter_corpus

    real = list(iter_corpus(DATA / "corpus" / "wiki_passages.jsonl.gz"))
    words = sorted({w for _, _, text in real for w in text.split()})
    rng = random.Random(0)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        for i in range(n):
            pid, title, text = real[i % len(real)]
            copy = i // len(real)
            if copy:
                toks = text.split()
                for j in rng.sample(range(len(toks)), k=len(toks) // 5):
                    toks[j] = rng.choice(words)
                text, title = " ".join(toks), f"{title} ({copy})"
            fh.write(json.dumps({"id": f"s{i}", "title": title, "text": text}) + "\n")


def queries(n: int) -> list[str]:
    with open(DATA / "search" / "hotpotqa_dev.jsonl") as fh:
        return [json.loads(line)["question"] for _, line in zip(range(n), fh)]


def rss() -> float:
    return psutil.Process().memory_info().rss / 2**20


def run_drmas(corpus: str, n_queries: int) -> dict:
    from drmas_envs.search.retrievers import BM25Retriever, DiskStore, MemoryStore, iter_corpus, load_index
    from drmas_envs.search.retrievers.index import build_index

    qs = queries(n_queries)
    records = list(iter_corpus(corpus))
    base = rss()
    t = time.perf_counter()
    retriever = BM25Retriever.build(MemoryStore(records))
    build_s = time.perf_counter() - t
    build_mib = rss() - base
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        out = build_index(corpus, "bm25", Path(tmp) / "idx")  # the full path: read, store, index, save
        full_build_s = time.perf_counter() - t
        t = time.perf_counter()
        before = rss()
        loaded = load_index(out)
        load_s = time.perf_counter() - t
        load_mib = rss() - before
        assert isinstance(loaded.store, DiskStore)
        size_mib = sum(f.stat().st_size for f in Path(out).rglob("*") if f.is_file()) / 2**20
        t = time.perf_counter()
        for q in qs:
            loaded.search([q], 3)
        one_mmap = len(qs) / (time.perf_counter() - t)
        t = time.perf_counter()
        loaded.search(qs, 3)
        batch_mmap = len(qs) / (time.perf_counter() - t)
    t = time.perf_counter()
    for q in qs:
        retriever.search([q], 3)
    one = len(qs) / (time.perf_counter() - t)
    t = time.perf_counter()
    top = retriever.search(qs, 3)
    batched = len(qs) / (time.perf_counter() - t)
    return {
        "build_s": build_s, "build_mib": build_mib, "full_build_s": full_build_s, "load_s": load_s,
        "load_mib": load_mib, "index_mib": size_mib, "one_qps": one, "batch_qps": batched,
        "one_qps_mmap": one_mmap, "batch_qps_mmap": batch_mmap, "top_ids": [[p.id for p in h] for h in top[:20]],
    }  # fmt: skip


def run_rank(corpus: str, n_queries: int) -> dict:
    import numpy as np
    from rank_bm25 import BM25Okapi

    from drmas_envs.search.retrievers import iter_corpus
    from drmas_envs.search.retrievers.bm25 import tokenize

    qs = queries(n_queries)
    records = list(iter_corpus(corpus))
    base = rss()
    t = time.perf_counter()
    bm25 = BM25Okapi([tokenize(f"{title} {text}") for _, title, text in records])
    build_s = time.perf_counter() - t
    build_mib = rss() - base
    t = time.perf_counter()
    top = []
    for q in qs:
        scores = bm25.get_scores(tokenize(q))
        idx = np.argpartition(-scores, 3)[:3]
        top.append([records[i][0] for i in idx[np.argsort(-scores[idx])]])
    qps = len(qs) / (time.perf_counter() - t)
    return {"build_s": build_s, "build_mib": build_mib, "one_qps": qps, "top_ids": top}


def child(kind: str, corpus: str, n: int) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "drmas_benchmarks.retrieval_speed",
        "--child",
        kind,
        "--corpus",
        corpus,
        "--queries",
        str(n),
    ]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])


def report(n_passages: int, drmas: dict, rank: dict, n_q: int, n_rank: int) -> None:
    agree = sum(a[0] == b[0] for a, b in zip(drmas["top_ids"], rank["top_ids"])) / min(len(rank["top_ids"]), 20)
    lines = [
        f"# BM25 speed: {n_passages:,} passages, top-3",
        "",
        "Corpus: the 32,717 real passages plus perturbed copies (20% of words replaced), see the script's docstring.",
        f"Queries: the first {n_q} HotpotQA dev questions (rank-bm25: the first {n_rank}). End to end, one process.",
        "",
        "| | drmas BM25 (bm25s index, own scoring) | rank-bm25 | speed-up |",
        "|---|---|---|---|",
        f"| queries/s, one by one | {drmas['one_qps']:.0f} | {rank['one_qps']:.2f} "
        f"| {drmas['one_qps'] / rank['one_qps']:.0f}x |",
        f"| queries/s, one batch of {n_q} | {drmas['batch_qps']:.0f} | (no batch API) "
        f"| {drmas['batch_qps'] / rank['one_qps']:.0f}x |",
        f"| index build (s) | {drmas['build_s']:.1f} | {rank['build_s']:.1f} | |",
        f"| RSS growth while building (MiB) | {drmas['build_mib']:.0f} | {rank['build_mib']:.0f} | |",
        "",
        "From a saved index folder (memory-mapped, as `drmas-retrieval serve` and cached envs use it):",
        "",
        f"- build folder from the .jsonl.gz (read, passage store, index, save): {drmas['full_build_s']:.1f} s; "
        f"size on disk {drmas['index_mib']:.0f} MiB",
        f"- load: {drmas['load_s'] * 1000:.0f} ms, RSS growth {drmas['load_mib']:.0f} MiB",
        f"- queries/s one by one {drmas['one_qps_mmap']:.0f}, batched {drmas['batch_qps_mmap']:.0f}",
        "",
        f"Top-1 agreement with rank-bm25 on the first {min(len(rank['top_ids']), 20)} queries: {agree:.0%} "
        "(the two use different BM25 variants: bm25s Lucene IDF, rank-bm25 Okapi with an epsilon floor).",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, shared with other jobs "
        f"(1-min load average at the end: {os.getloadavg()[0]:.1f}).",
        "",
        "Reproduce: `.venv/bin/python -m drmas_benchmarks.retrieval_speed`",
    ]
    OUT.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n-passages", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--rank-queries", type=int, default=20)
    parser.add_argument("--child", choices=("drmas", "rank"), help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = (run_drmas if args.child == "drmas" else run_rank)(args.corpus, args.queries)
        print(json.dumps(result))
        return
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "synth.jsonl.gz"
        synth_corpus(corpus, args.n_passages)
        drmas = child("drmas", str(corpus), args.queries)
        rank = child("rank", str(corpus), args.rank_queries)
    report(args.n_passages, drmas, rank, args.queries, args.rank_queries)
    print(
        json.dumps({k: v for k, v in drmas.items() if k != "top_ids"}),
        json.dumps({k: v for k, v in rank.items() if k != "top_ids"}),
    )
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
