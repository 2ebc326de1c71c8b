"""Recall@3 of IVF-PQ at more bytes per passage, over retrieval_scale's 1M MiniLM vectors.

retrieval_scale.py builds IVF-PQ at the default dim / 4 bytes per passage (96 for MiniLM's 384 dims, 192
for e5's 768) and reports its recall@3 against exact search by nprobe. This builds the same index at
`--m` bytes per passage and measures the same recall on the same 500 encoded HotpotQA questions, plus
how close the exact 3rd and 4th scores are (the closer, the easier a compressed score swaps them) and
the share of the exact top 3 that are real passages rather than filler.

    python -m drmas_benchmarks.retrieval_pq_bytes --m 192   # after retrieval_scale.py --n 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

from drmas_benchmarks.machine import cpu_line
from drmas_benchmarks.retrieval_scale_report import N_REAL
from drmas_benchmarks.service_load import questions

RESULTS = Path(__file__).resolve().parents[1] / "results"


def main() -> None:
    from drmas_envs.search.retrievers.ann import IVFPQConfig, build_ivfpq, set_nprobe
    from drmas_envs.search.retrievers.dense import encode_queries, load_model, resolve_encoder
    from drmas_envs.search.retrievers.vectors import exact_top_k, load_vectors, recall_at_k

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vectors", type=Path, default=Path("/tmp/drmas-retrieval-scale/vectors-1000000.npy"))
    ap.add_argument("--m", type=int, nargs="+", default=[192])
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--out", type=Path, default=RESULTS / "retrieval_pq_bytes.json")
    args = ap.parse_args()
    spec = resolve_encoder("minilm")
    q = encode_queries(load_model(spec.model), spec, questions(args.queries))
    vecs = load_vectors(args.vectors)
    scores, exact = exact_top_k(q, vecs, 4)
    out: dict = {
        "machine": cpu_line(),
        "load_before": os.getloadavg(),
        "passages": len(vecs),
        "queries": len(q),
        "exact_gap_3rd_4th_median": float(np.median(scores[:, 2] - scores[:, 3])),
        "exact_top1_score_median": float(np.median(scores[:, 0])),
        "exact_top3_real_share": float((exact[:, :3] < N_REAL).mean()),
        "by_m": {},
    }
    for m in args.m:
        t = time.perf_counter()
        index = build_ivfpq(vecs, IVFPQConfig(nlist=1024, m=m))
        row = {"build_s": time.perf_counter() - t, "recall_at_3_by_nprobe": {}}
        for nprobe in (8, 16, 32, 64, 128):
            set_nprobe(index, nprobe)
            _, approx = index.search(q, 3)
            row["recall_at_3_by_nprobe"][nprobe] = recall_at_k(approx, exact[:, :3])
        out["by_m"][m] = row
    out["load_after"] = os.getloadavg()
    args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
