"""Re-ranked dense retrieval at scale: IVF-PQ proposes a shortlist, exact inner products over the float32 vectors
memory-mapped off disk decide (`drmas_envs.search.retrievers.rerank`).

Corpus and vectors: `retrieval_scale_data.py` (the real passages plus filler, MiniLM; cached in --work). Stages:
- build: `build_index(..., "faiss", ivfpq=IVFPQConfig(shortlist=...))` in a child process: wall time, peak RssAnon;
- recall: recall@3 / @10 against exact float32 search per shortlist and nprobe, `--recall-queries` HotpotQA dev
  questions encoded with MiniLM; plain IVF-PQ (no re-ranking) beside it;
- hits: hit@3 (a gold answer, SQuAD-normalised, inside one of the top 3 passages) on real questions whose answer
  is in the corpus (HotpotQA dev with context, yes/no dropped; NQ test 1000, those with an answer-bearing
  passage), for exact, re-ranked and plain compressed search;
- serve: the stdlib server in a child process at `--nprobe` / `--shortlist`, query encoding inside; 1 and 64
  keep-alive clients, each client its own HotpotQA questions (no query repeats within a run); cold (the vectors
  file evicted with posix_fadvise(DONTNEED) before the server starts) and warm (the file read once before).
  The server's RssAnon, the vectors file's pages resident in it (the page-cache working set) and its disk reads.

    python -m drmas_benchmarks.retrieval_rerank --n 250000 --work /tmp/drmas-retrieval-scale \
        [--stages build,recall,hits,serve] [--nprobe 64] [--shortlist 200]

Writes `rerank-n<N>.json` in --work, then the dense_reranked rows of benchmarks/results/retrieval_scale.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import requests

from drmas_benchmarks.machine import cpu_line
from drmas_benchmarks.retrieval_rerank_quality import hits, recall_grid
from drmas_benchmarks.retrieval_scale import AnonPeak, _vm
from drmas_benchmarks.retrieval_scale_data import encoded_real, write_corpus, write_vectors
from drmas_benchmarks.service_load import client_process, free_port, questions

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def child_build(corpus: str, vectors: str, out: str, shortlist: str, nprobe: str) -> None:
    from drmas_envs.search.retrievers import build_index
    from drmas_envs.search.retrievers.ann import IVFPQConfig
    from drmas_envs.search.retrievers.dense import load_model, resolve_encoder

    load_model(resolve_encoder("minilm").model)  # in the baseline, as a server has it
    base = _vm("RssAnon")
    peak = AnonPeak()
    start = time.perf_counter()
    cfg = IVFPQConfig(shortlist=int(shortlist), nprobe=int(nprobe))
    build_index(corpus, "faiss", out, vectors=vectors, ivfpq=cfg)
    print(json.dumps({"build_s": time.perf_counter() - start, "base_anon": base, "peak_anon": peak.stop()}))


def child_serve(index: str, port: str, info: str, nprobe: str, shortlist: str) -> None:
    from drmas_envs.search.retrievers import load_index
    from drmas_envs.search.retrievers.ann import ServeConfig
    from drmas_envs.search.retrievers.dense import load_model, resolve_encoder
    from drmas_retrieval import ServiceConfig, make_server

    load_model(resolve_encoder("minilm").model)
    import faiss  # noqa: F401 - in the baseline, as the encoder is

    base = _vm("RssAnon")
    retriever = load_index(index, ServeConfig(nprobe=int(nprobe), shortlist=int(shortlist)))
    server = make_server(retriever, ServiceConfig(port=int(port)))
    Path(info).write_text(json.dumps({"base_anon": base, "loaded_anon": _vm("RssAnon")}))
    server.serve_forever()


def _child(*args: str) -> list[str]:
    return [sys.executable, "-m", "drmas_benchmarks.retrieval_rerank", "--child", *args]


def evict(path: Path) -> None:
    """Drop `path`'s pages from the page cache (those no process maps)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cached_bytes(path: Path) -> int:
    """Bytes of `path` in the page cache now (util-linux fincore)."""
    out = subprocess.run(["fincore", "-b", "-n", "-o", "RES", str(path)], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[0])


def mapped_resident(pid: int, path: Path) -> int:
    """Bytes of `path` resident in process `pid`'s mappings (its page-cache working set), from smaps."""
    total, inside = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            inside = len(head) >= 6 and head[5] == str(path)
        elif inside and line.startswith("Rss:"):
            total += int(head[1]) * 1024
    return total


def proc_field(pid: int, name: str, field: str) -> int:
    for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
        if line.startswith(field + ":"):
            value = line.split()[1]
            return int(value) * (1024 if name == "status" else 1)
    raise KeyError(field)


def load_run(url: str, clients: int, seconds: float) -> dict:
    """`clients` keep-alive clients (each its own questions) for up to `seconds`; latency percentiles."""
    per_client = len(questions()) // clients
    procs = 1 if clients == 1 else 2
    deadline = time.time() + seconds
    with ProcessPoolExecutor(procs) as pool:
        offsets = [p * (clients // procs) * per_client for p in range(procs)]
        runs = list(pool.map(client_process, [url] * procs, [clients // procs] * procs, [per_client] * procs,
                             offsets, [deadline] * procs))  # fmt: skip
    lat = np.concatenate([r["lat"] for r in runs])
    wall = max(r["end"] for r in runs) - min(r["start"] for r in runs)
    return {
        "clients": clients,
        "requests": len(lat),
        "failures": sum(len(r["failures"]) for r in runs),
        "qps": len(lat) / wall,
        "p50_ms": float(np.percentile(lat, 50) * 1e3),
        "p99_ms": float(np.percentile(lat, 99) * 1e3),
    }


def serve(index: Path, flat: Path, work: Path, args: argparse.Namespace, cold: bool, clients: int) -> dict:
    """One server process, one load run: cold (vectors evicted before the start) or warm (read before)."""
    if cold:
        evict(flat)
    else:
        with open(flat, "rb") as fh:
            while fh.read(1 << 24):
                pass
    before_cache = cached_bytes(flat)
    port, info = free_port(), work / "serve-rerank.json"
    info.unlink(missing_ok=True)
    proc = subprocess.Popen(_child("serve", str(index), str(port), str(info), str(args.nprobe), str(args.shortlist)))
    url = f"http://127.0.0.1:{port}"
    try:
        while not info.exists():
            if proc.poll() is not None:
                raise RuntimeError("the server exited")
            time.sleep(0.2)
        requests.post(f"{url}/retrieve", json={"queries": ["warm up the encoder"], "topk": 3}, timeout=120)
        read0 = proc_field(proc.pid, "io", "read_bytes")
        row = load_run(url, clients, args.seconds)
        row.update(
            cold=cold,
            load=os.getloadavg()[0],
            page_cache_before=before_cache,
            disk_read_bytes=proc_field(proc.pid, "io", "read_bytes") - read0,
            vectors_resident=mapped_resident(proc.pid, flat),
            rss_anon=proc_field(proc.pid, "status", "RssAnon"),
            **json.loads(info.read_text()),
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=250_000)
    parser.add_argument("--work", type=Path, default=Path("/tmp/drmas-retrieval-scale"))
    parser.add_argument("--stages", default="build,recall,hits,serve")
    parser.add_argument("--nprobe", type=int, default=64, help="clusters searched (build default and serving)")
    parser.add_argument("--shortlist", type=int, default=200, help="candidates re-ranked (build and serving)")
    parser.add_argument("--recall-queries", type=int, default=500)
    parser.add_argument("--hit-questions", type=int, default=0, help="questions per set for hit@3 (0: all)")
    parser.add_argument("--seconds", type=float, default=45.0, help="at most this long per load run")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of retrieval_scale.json / .md")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        role, *rest = args.child
        return child_build(*rest) if role == "build" else child_serve(*rest)
    work, n = args.work, args.n
    corpus, vectors, index = work / f"corpus-{n}.jsonl", work / f"vectors-{n}.npy", work / f"idx-dense_reranked-{n}"
    out_file = work / f"rerank-n{n}.json"
    res = json.loads(out_file.read_text()) if out_file.exists() else {}
    res.update(machine=cpu_line(), n=n, real_encoded=encoded_real(work), filler_encoded=encoded_real(work, "filler"))
    if not corpus.exists():
        write_corpus(corpus, n)
    if not vectors.exists():
        write_vectors(work, n, vectors)
    stages = args.stages.split(",")
    if "build" in stages:
        load = os.getloadavg()[0]
        cmd = _child("build", str(corpus), str(vectors), str(index), str(args.shortlist), str(args.nprobe))
        line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        disk = {f.name: f.stat().st_size for f in index.rglob("*") if f.is_file()}
        res["build"] = {**json.loads(line), "load": load, "disk": disk}
        print("build", res["build"], flush=True)
        out_file.write_text(json.dumps(res, indent=1))
    from drmas_envs.search.retrievers.rerank import read_refine

    flat = Path(read_refine(index / "faiss")["vectors"])

    def save() -> None:  # after each stage: a later one failing keeps what the earlier ones measured
        out_file.write_text(json.dumps(res, indent=1))

    if "recall" in stages:
        load = os.getloadavg()[0]
        res["recall"] = {**recall_grid(index, vectors, args.recall_queries), "load": [load, os.getloadavg()[0]]}
        print("recall", res["recall"], flush=True)
        save()
    if "hits" in stages:
        load = os.getloadavg()[0]
        res["hits"] = hits(index, vectors, corpus, args.nprobe, args.shortlist, args.hit_questions)
        res["hits"]["load"] = [load, os.getloadavg()[0]]
        print("hits", res["hits"], flush=True)
        save()
    if "serve" in stages:
        res["serve"] = {"nprobe": args.nprobe, "shortlist": args.shortlist, "runs": []}
        for cold in (True, False):
            for clients in (1, 64):
                row = serve(index, flat, work, args, cold, clients)
                print("serve", row, flush=True)
                res["serve"]["runs"].append(row)
    save()
    if {"build", "recall", "serve"} <= res.keys():  # stages may be run one at a time; report once all are in
        from drmas_benchmarks.retrieval_rerank_report import write_rerank

        smaller = [json.loads(f.read_text()) for f in sorted(work.glob("rerank-n*.json")) if f != out_file]
        write_rerank(res, args.results, [r for r in smaller if "recall" in r and "hits" in r])


if __name__ == "__main__":
    main()
