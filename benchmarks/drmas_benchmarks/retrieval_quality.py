"""Retrieval quality on real data: recall@3 and recall@10 of HotpotQA's gold paragraphs, BM25 vs dense.

Questions: ../shared/data/search/hotpotqa_dev_with_context.jsonl (1,525 HotpotQA dev questions, each
with two gold paragraphs in `supporting_ids`). Corpus: ../shared/data/corpus/wiki_passages.jsonl.gz
(32,717 passages: the questions' gold and distractor paragraphs plus other Wikipedia passages).
A gold paragraph counts as found when a passage with its title is in the top k (titles are unique
per paragraph in HotpotQA). recall@k = mean over questions of (gold titles found / gold titles);
all@k = share of questions with every gold title found.

    .venv/bin/python -m drmas_benchmarks.retrieval_quality [--retrievers bm25,dense] [--n 1525]

Indexes are built once into the cache ($DRMAS_CACHE_DIR or ~/.cache/drmas); building the dense one
encodes every passage (minutes on 2 cores). Writes benchmarks/results/retrieval_quality.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections import defaultdict
from pathlib import Path

from drmas_envs.search.retrievers import get_retriever, iter_corpus

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("DRMAS_DATA_DIR") or ROOT.parent / "shared" / "data")
OUT = ROOT / "benchmarks" / "results" / "retrieval_quality.md"


def evaluate(name: str, retriever, questions: list[dict], gold: list[set[str]], ks=(3, 10)) -> dict:
    start = time.perf_counter()
    hits = []
    for i in range(0, len(questions), 64):
        hits += retriever.search([q["question"] for q in questions[i : i + 64]], max(ks))
    seconds = time.perf_counter() - start
    row: dict = {"retriever": name, "queries_per_s": len(questions) / seconds}
    by_type: dict[str, list[float]] = defaultdict(list)
    for k in ks:
        recalls, alls = [], []
        for q, g, h in zip(questions, gold, hits):
            found = g & {p.title for p in h[:k]}
            recalls.append(len(found) / len(g))
            alls.append(float(found == g))
            if k == max(ks):
                by_type[q.get("type", "?")].append(len(found) / len(g))
        row[f"recall@{k}"] = sum(recalls) / len(recalls)
        row[f"all@{k}"] = sum(alls) / len(alls)
    row["by_type"] = {t: sum(v) / len(v) for t, v in sorted(by_type.items())}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--retrievers", default="bm25,dense")
    parser.add_argument("--n", type=int, default=None, help="first n questions (default: all)")
    args = parser.parse_args()
    corpus = DATA / "corpus" / "wiki_passages.jsonl.gz"
    qfile = DATA / "search" / "hotpotqa_dev_with_context.jsonl"
    titles = {pid: title for pid, title, _ in iter_corpus(corpus)}
    questions = [json.loads(line) for line in qfile.open()][: args.n]
    gold = [{titles[i] for i in q["supporting_ids"]} for q in questions]
    rows = []
    for name in args.retrievers.split(","):
        start = time.perf_counter()
        retriever = get_retriever(name, str(corpus))
        ready = time.perf_counter() - start
        row = evaluate(name if name == "bm25" else "dense (all-MiniLM-L6-v2)", retriever, questions, gold)
        row["index_ready_s"] = ready
        rows.append(row)
        print(json.dumps(row))
    lines = [
        "# Retrieval quality: HotpotQA dev gold paragraphs",
        "",
        f"{len(questions)} questions of `hotpotqa_dev_with_context.jsonl` (2 gold paragraphs each) against",
        f"`wiki_passages.jsonl.gz` ({len(titles):,} passages). Found = a passage with the gold title in the top k.",
        "recall@k: mean share of gold titles found; all@k: share of questions with both found.",
        "",
        "| retriever | recall@3 | recall@10 | all@3 | all@10 | recall@10 bridge | recall@10 comparison "
        "| queries/s | index ready (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        bt = r["by_type"]
        lines.append(
            f"| {r['retriever']} | {r['recall@3']:.3f} | {r['recall@10']:.3f} | {r['all@3']:.3f} | {r['all@10']:.3f} "
            f"| {bt.get('bridge', float('nan')):.3f} | {bt.get('comparison', float('nan')):.3f} "
            f"| {r['queries_per_s']:.0f} | {r['index_ready_s']:.1f} |"
        )
    lines += [
        "",
        "index ready = building the index (or loading it from the cache when it was already built) in this run.",
        "queries/s = batches of 64 queries, top-10, on this machine (dense: includes encoding the queries).",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, shared with other jobs "
        f"(1-min load average at the end: {os.getloadavg()[0]:.1f}).",
        "",
        "Reproduce: `.venv/bin/python -m drmas_benchmarks.retrieval_quality`",
    ]
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
