"""The retrieval service under load on loopback: 200 concurrent clients, zero failures expected.

Serves a BM25 index of ../shared/data/corpus/wiki_passages.jsonl.gz (32,717 passages; the generated
world's corpus if the data is absent) with the real CLI (`drmas-retrieval serve`) in its own process.
Clients: 4 processes x 50 threads, each thread one keep-alive `requests.Session` sending a bounded
number of single-query requests (HotpotQA dev questions, topk 3) back to back. A request fails if it
raises or gets anything but 200 with one list of <= 3 hits. Then hostile requests (malformed JSON, a
missing field, topk=10**9, a 10 MB body) must get 4xx and a normal request must still succeed.
Each load runs twice: with dynamic batching (default) and with --max-batch 1 (no batching). With
--dense-requests N, the same with a dense MiniLM index of the generated world (440 passages), where the
cost is encoding the queries (not run for the committed result: too slow on the shared 2 cores).

    .venv/bin/python benchmarks/service_load.py [--clients 200] [--requests 10] [--dense-requests 0]

Writes benchmarks/results/service_load.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("DRMAS_DATA_DIR") or ROOT.parent / "shared" / "data")
OUT = ROOT / "benchmarks" / "results" / "service_load.md"
PROCESSES = 4


def questions(n: int = 2000) -> list[str]:
    path = DATA / "search" / "hotpotqa_dev.jsonl"
    if not path.is_file():
        return [f"question about city {i}" for i in range(n)]
    with open(path) as fh:
        return [json.loads(line)["question"] for _, line in zip(range(n), fh)]


def client_process(url: str, threads: int, n_requests: int, offset: int) -> tuple[list[float], list[str]]:
    """Run `threads` clients in this process; returns (latencies in s, failure descriptions)."""
    qs = questions()
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads)

    def client(i: int) -> None:
        session = requests.Session()
        barrier.wait()
        for j in range(n_requests):
            q = qs[(offset + i * n_requests + j) % len(qs)]
            t = time.perf_counter()
            try:
                r = session.post(f"{url}/retrieve", json={"queries": [q], "topk": 3, "return_scores": True}, timeout=60)
                ok = r.status_code == 200 and len(r.json()["result"]) == 1 and len(r.json()["result"][0]) <= 3
                why = "" if ok else f"HTTP {r.status_code}"
            except Exception as exc:  # a benchmark counts failures, it does not stop on them
                ok, why = False, f"{type(exc).__name__}: {exc}"
            dt = time.perf_counter() - t
            with lock:
                (latencies.append(dt) if ok else failures.append(why))

    pool = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return latencies, failures


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(index: str, max_batch: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "drmas_retrieval.cli", "serve", "--index", index, "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--max-batch", str(max_batch)], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(1800):  # a dense server imports torch and loads its encoder first
        try:
            if requests.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except requests.ConnectionError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server did not start")


def hostile(url: str) -> dict[str, int]:
    post = lambda body: requests.post(f"{url}/retrieve", data=body, timeout=30).status_code  # noqa: E731
    out = {
        "malformed JSON": post(b"{not json"),
        "missing queries": post(json.dumps({"topk": 3}).encode()),
        "topk=10**9": post(json.dumps({"query": "x", "topk": 10**9}).encode()),
        "10 MB body": post(b"x" * (10 << 20)),
    }
    out["normal request afterwards"] = post(json.dumps({"query": "Ed Wood", "topk": 3}).encode())
    return out


def run(index: str, clients: int, n_requests: int, max_batch: int) -> dict:
    proc, url = start_server(index, max_batch)
    try:
        per = clients // PROCESSES
        t = time.perf_counter()
        with ProcessPoolExecutor(PROCESSES) as pool:
            parts = list(pool.map(client_process, [url] * PROCESSES, [per] * PROCESSES, [n_requests] * PROCESSES,
                                  [p * per * n_requests for p in range(PROCESSES)]))  # fmt: skip
        wall = time.perf_counter() - t
        lat = np.array([x for p in parts for x in p[0]]) * 1000
        failures = [x for p in parts for x in p[1]]
        health = requests.get(f"{url}/health", timeout=10).json()
        return {
            "max_batch": max_batch, "clients": per * PROCESSES, "requests": per * PROCESSES * n_requests,
            "ok": len(lat), "failed": len(failures), "failure_examples": failures[:3], "wall_s": wall,
            "rps": len(lat) / wall, "p50_ms": float(np.percentile(lat, 50)), "p90_ms": float(np.percentile(lat, 90)),
            "p99_ms": float(np.percentile(lat, 99)), "max_ms": float(lat.max()),
            "mean_batch": health["queries"] / max(health["batches"], 1), "hostile": hostile(url),
        }  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(10)


def world_corpus(path: Path) -> Path:
    from drmas_envs.search.world import generate_world

    rows = (json.dumps({"id": i, "title": t, "text": x}) + "\n" for i, t, x in generate_world().passages)
    path.write_text("".join(rows))
    return path


def table(rows: list[dict]) -> list[str]:
    lines = [
        "| retriever | batching | requests | failed | requests/s | p50 ms | p90 ms | p99 ms | max ms "
        "| mean queries per retriever call |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        name = "dynamic (max 256)" if r["max_batch"] > 1 else "off (max 1)"
        lines.append(
            f"| {r['retriever']} | {name} | {r['requests']} | {r['failed']} | {r['rps']:.0f} | {r['p50_ms']:.0f} "
            f"| {r['p90_ms']:.0f} | {r['p99_ms']:.0f} | {r['max_ms']:.0f} | {r['mean_batch']:.1f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--requests", type=int, default=10, help="requests per client")
    parser.add_argument(
        "--dense-requests", type=int, default=0, help="requests per client for dense runs (default 0: skip)"
    )
    args = parser.parse_args()
    from drmas_envs.search.retrievers import build_index

    corpus = DATA / "corpus" / "wiki_passages.jsonl.gz"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if not corpus.is_file():
            corpus = world_corpus(Path(tmp) / "world.jsonl")
        index = str(build_index(corpus, "bm25", Path(tmp) / "index"))
        rows += [
            {"retriever": f"BM25, {corpus.name}", **run(index, args.clients, args.requests, mb)} for mb in (256, 1)
        ]
        if args.dense_requests:
            dense = str(build_index(world_corpus(Path(tmp) / "world.jsonl"), "dense", Path(tmp) / "dense"))
            rows += [
                {"retriever": "dense MiniLM, world (440)", **run(dense, args.clients, args.dense_requests, mb)}
                for mb in (256, 1)
            ]
    for r in rows:
        print(json.dumps(r))
    lines = [
        "# Retrieval service under load (loopback)",
        "",
        "Served by `drmas-retrieval serve` (stdlib ThreadingHTTPServer + one batching worker) in its own process.",
        f"{rows[0]['clients']} concurrent keep-alive clients ({PROCESSES} processes x "
        f"{rows[0]['clients'] // PROCESSES} threads), each sending {args.requests} one-query requests (topk 3) "
        "back to back. Server and clients share the machine.",
        "",
        *table(rows),
        "",
        "Hostile requests after each load run (status codes; the service kept answering):",
        "",
    ]
    lines += [f"- {k}: {v}" for k, v in rows[0]["hostile"].items()]
    same = all(r["hostile"] == rows[0]["hostile"] for r in rows)
    lines += [
        f"- identical in all {len(rows)} runs: {same}",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, shared with other jobs "
        f"(1-min load average at the end: {os.getloadavg()[0]:.1f}).",
        "",
        "Reproduce: `.venv/bin/python benchmarks/service_load.py`",
    ]
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
