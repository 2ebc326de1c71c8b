"""Retrieval at scale: BM25, exact dense and compressed (IVF-PQ) dense over ~1M passages, served on loopback.

Corpus and vectors: benchmarks/drmas_benchmarks/retrieval_scale_data.py (the real passages plus filler, MiniLM vectors;
read its docstring for what the filler vectors are). For each index kind, in its own process:
- build with `build_index` (the same code as `drmas-retrieval build`): wall time and peak RSS (VmHWM);
  dense kinds index the precomputed vectors (their encoding time is reported separately);
- serve with the stdlib server; 64 concurrent keep-alive clients (2 processes x 32 threads, one
  `requests.Session` each) send single-query Search-R1 requests ({"queries": [q], "topk": 3,
  "return_scores": true}, HotpotQA dev questions) for `--seconds`; query encoding is inside the server.
  Queries/s, p99 latency, and the server's RSS after the run (minus its RSS before the index was loaded).
Then recall@3 of the compressed index against exact search on `--recall-queries` HotpotQA questions
encoded with MiniLM, at several nprobe.

    python -m drmas_benchmarks.retrieval_scale [--n 1000000] [--seconds 60] [--work /tmp/drmas-retrieval-scale]

Writes benchmarks/results/retrieval_scale.md and .json from every run kept in the work folder (one
per --n and --kinds): each index kind is reported at the largest size it was measured at.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import requests

from drmas_benchmarks.machine import cpu_line
from drmas_benchmarks.retrieval_scale_data import DATA, embed, encoded_real, write_corpus, write_vectors
from drmas_benchmarks.retrieval_scale_report import write_report
from drmas_benchmarks.service_load import client_process, free_port, hostile, questions

ROOT = Path(__file__).resolve().parents[2]
KINDS = {"bm25": "bm25", "dense_exact": "dense", "dense_compressed": "faiss"}
GIB = 2**30


def _vm(field: str) -> int:
    """A /proc/self/status memory field in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


class AnonPeak:
    """The peak of RssAnon (memory the kernel cannot drop, unlike file-backed pages), sampled every 50 ms."""

    def __init__(self) -> None:
        self.peak = _vm("RssAnon")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, _vm("RssAnon"))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, _vm("RssAnon"))


def child_build(kind: str, corpus: str, vectors: str, out: str) -> None:
    """Build one index (in a fresh process, so peak RSS is this build's); prints a JSON line."""
    from drmas_envs.search.retrievers import build_index
    from drmas_envs.search.retrievers.dense import load_model, resolve_encoder

    if kind != "bm25":
        load_model(resolve_encoder("minilm").model)  # cached: the build reuses it, so it is in the baseline
        import faiss  # noqa: F401
    base, base_anon = _vm("VmRSS"), _vm("RssAnon")
    anon = AnonPeak()
    start = time.perf_counter()
    build_index(corpus, KINDS[kind], out, vectors=vectors if kind != "bm25" else None)
    took = time.perf_counter() - start
    row = {
        "build_s": took,
        "peak_rss": _vm("VmHWM"),
        "base_rss": base,
        "peak_anon": anon.stop(),
        "base_anon": base_anon,
    }
    print(json.dumps({**row, "encoder_in_base": kind != "bm25"}))


def child_serve(kind: str, index: str, port: int, info: str) -> None:
    """Serve one index; writes the RSS before the index was loaded (encoder already loaded) to `info`."""
    from drmas_envs.search.retrievers import load_index
    from drmas_envs.search.retrievers.dense import load_model, resolve_encoder
    from drmas_retrieval import ServiceConfig, make_server

    if kind != "bm25":
        load_model(resolve_encoder("minilm").model)  # cached: load_index reuses it
        import faiss  # noqa: F401 - counted in the baseline, as the encoder is

    base = _vm("VmRSS")
    server = make_server(load_index(index), ServiceConfig(port=port))
    Path(info).write_text(json.dumps({"base_rss": base, "loaded_rss": _vm("VmRSS")}))
    server.serve_forever()


def build(kind: str, corpus: Path, vectors: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "drmas_benchmarks.retrieval_scale",
        "--child",
        "build",
        kind,
        str(corpus),
        str(vectors),
        str(out),
    ]
    line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return json.loads(line)


def serve_and_load(kind: str, index: Path, work: Path, clients: int, seconds: float) -> dict:
    port, info = free_port(), work / f"serve-{kind}.json"
    info.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "drmas_benchmarks.retrieval_scale",
            "--child",
            "serve",
            kind,
            str(index),
            str(port),
            str(info),
        ]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(1200):
            if info.exists():
                break
            time.sleep(0.1)
        requests.post(f"{url}/retrieve", json={"queries": ["warm up"], "topk": 3}, timeout=120).raise_for_status()
        deadline = time.time() + seconds
        with ProcessPoolExecutor(2) as pool:
            runs = list(
                pool.map(client_process, [url] * 2, [clients // 2] * 2, [10**6] * 2, [0, 50_000], [deadline] * 2)
            )
        rss = psutil.Process(proc.pid).memory_info().rss
        bad = hostile(url)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    lat = np.concatenate([r["lat"] for r in runs])
    wall = max(r["end"] for r in runs) - min(r["start"] for r in runs)
    mem = json.loads(info.read_text())
    return {
        "requests": len(lat),
        "failures": sum(len(r["failures"]) for r in runs),
        "qps": len(lat) / wall,
        "p50_ms": float(np.percentile(lat, 50) * 1e3),
        "p99_ms": float(np.percentile(lat, 99) * 1e3),
        "serve_rss": rss,
        "serve_base_rss": mem["base_rss"],
        "hostile": bad,
    }


def recall(index_dir: Path, vectors: Path, n_queries: int) -> dict:
    """Recall@3 of the compressed index against exact search on encoded HotpotQA questions, by nprobe."""
    import faiss

    from drmas_envs.search.retrievers.ann import set_nprobe
    from drmas_envs.search.retrievers.dense import encode_queries, load_model, resolve_encoder
    from drmas_envs.search.retrievers.vectors import exact_top_k, load_vectors, recall_at_k

    spec = resolve_encoder("minilm")
    q = encode_queries(load_model(spec.model), spec, questions(n_queries))
    vecs = load_vectors(vectors)
    _, exact = exact_top_k(q, vecs, 3)
    index = faiss.read_index(str(index_dir / "faiss" / "index.faiss"))
    built = faiss.extract_index_ivf(index).nprobe
    out = {"built_nprobe": built, "queries": len(q), "by_nprobe": {}}
    for nprobe in sorted({8, 16, built, 64, 128}):
        set_nprobe(index, nprobe)
        _, approx = index.search(q, 3)
        out["by_nprobe"][nprobe] = recall_at_k(approx, exact)
    out["recall_at_3"] = out["by_nprobe"][built]
    out["build_report"] = json.loads((index_dir / "faiss" / "build_report.json").read_text())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/drmas-retrieval-scale"))
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--recall-queries", type=int, default=1000)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument(
        "--real-encoded", type=int, help="encode at most this many real passages (others: sentence-mean vectors)"
    )
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        role, *rest = args.child
        return child_build(*rest) if role == "build" else child_serve(rest[0], rest[1], int(rest[2]), rest[3])
    if not (DATA / "corpus" / "wiki_passages.jsonl.gz").is_file():
        raise SystemExit(f"needs the real corpus at {DATA}/corpus/wiki_passages.jsonl.gz (or set DRMAS_DATA_DIR)")
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"machine": cpu_line(), "n": args.n, "clients": args.clients, "seconds": args.seconds}
    facts = work / "embed_facts.json"
    saved = json.loads(facts.read_text()) if facts.exists() else {}
    # a cached encoding keeps the rate of the run that made it
    results["embed"] = {**saved, **embed(work, args.real_encoded)}
    results["embed"]["real_encoded"] = encoded_real(work)
    results["embed"]["filler_encoded"] = encoded_real(work, "filler")
    facts.write_text(json.dumps(results["embed"], indent=1))
    corpus, vectors = work / f"corpus-{args.n}.jsonl", work / f"vectors-{args.n}.npy"
    if not corpus.exists():
        results["n_real"] = write_corpus(corpus, args.n)
    if not vectors.exists() and args.kinds != "bm25":
        write_vectors(work, args.n, vectors)
    results["kinds"] = {}
    for kind in args.kinds.split(","):
        out = work / f"idx-{kind}-{args.n}"
        row = {"load_before": os.getloadavg()}
        row.update(build(kind, corpus, vectors, out))
        print(kind, "built", row, flush=True)
        row.update(serve_and_load(kind, out, work, args.clients, args.seconds))
        row["load_after"] = os.getloadavg()
        row["disk_bytes"] = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        print(kind, "served", {k: v for k, v in row.items() if k != "hostile"}, flush=True)
        results["kinds"][kind] = row
        if kind == "dense_compressed":
            results["recall"] = recall(out, vectors, args.recall_queries)
            print("recall", results["recall"], flush=True)
    (work / f"results-n{args.n}-{'-'.join(results['kinds'])}.json").write_text(
        json.dumps(results, indent=1, default=float)
    )
    runs = [json.loads(f.read_text()) for f in sorted(work.glob("results-n*.json"))]
    write_report(runs, ROOT / "benchmarks" / "results")


if __name__ == "__main__":
    main()
