"""The retrieval service under hostile clients on loopback: peak memory against its stated bound, and an
ordinary client's latency against its unloaded latency.

Serves a BM25 index of ../shared/data/corpus/wiki_passages.jsonl.gz (the generated world's corpus if
the data is absent) with the real CLI (`drmas-retrieval serve`, default flags) in its own process,
fresh for each mix. The hostile mixes (drmas_benchmarks.service_attackers) run in other processes:
slowloris, non-reading and heavy clients, each mix alone and then all together, then `--idle`
connections opened at once and left silent. With `--pin` the attackers run on one core and the server
and the ordinary client on the others (a model of attackers elsewhere). Throughout, one
ordinary client (a keep-alive `requests.Session`, as `HTTPRetriever` uses, opened before the mix
starts) sends one-question requests (topk 3) back to back; a 503 is retried after 0.1 s and the
latency counts until the 200. Recorded per mix: the server's peak RSS (VmHWM) against the bound it
states in /health, the ordinary client's p50/p99 against its unloaded p99, and the statuses the
probes (deep JSON, a 5,000-digit integer, ambiguous framing) get after the mix; also the server's
peak thread count and its CPU time by thread.

    .venv/bin/python -m drmas_benchmarks.service_load --hostile [--clients 300] [--seconds 30] [--pin]

Writes benchmarks/results/service_load_hostile.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
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

from drmas_benchmarks.machine import cpu_line
from drmas_benchmarks.service_attackers import run_mix
from drmas_benchmarks.service_hostile_report import report
from drmas_benchmarks.service_load import DATA, ROOT, cpu_seconds, free_port, questions, wait_healthy, world_corpus

OUT = ROOT / "benchmarks" / "results" / "service_load_hostile.md"
MIXES = [("slowloris",), ("nonreading",), ("heavy",), ("slowloris", "nonreading", "heavy"), ("idle",)]


def _framed(body: bytes) -> bytes:
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


PROBES = {
    "deep JSON": _framed(b"[" * 100_000 + b"]" * 8),
    "5,000-digit integer": _framed(b'{"query": "x", "topk": ' + b"7" * 5000 + b"}"),
    "Transfer-Encoding beside Content-Length": b"Transfer-Encoding: gzip, chunked\r\n" + _framed(b"{}"),
}


def _pin(cpus: set[int] | None) -> None:
    """Run this process (its threads started from now) on `cpus`; None leaves it where it is."""
    if cpus:
        os.sched_setaffinity(0, cpus)


def _attack(kind: str, *args: object) -> dict:
    """`run_mix` in a pool process, with the CPU seconds its process used."""
    counts = run_mix(kind, *args)  # type: ignore[arg-type]
    return counts | {"CPU s": round(time.process_time(), 1)}


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a process so far: its main thread (accepts, refusals), its busiest other thread (the
    batcher's worker), and the rest (connection handlers, ended ones included)."""
    tasks = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    main = cpu_seconds_of(f"/proc/{pid}/task/{pid}/stat")
    top = max((cpu_seconds_of(f"/proc/{pid}/task/{t}/stat") for t in tasks if t != pid), default=0.0)
    total = cpu_seconds(pid)
    return {"main": round(main, 1), "busiest other": round(top, 1), "rest": round(total - main - top, 1)}


def cpu_seconds_of(stat: str) -> float:
    try:
        fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:  # the thread ended since the listing
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class PeakThreads(threading.Thread):
    """Samples a process's thread count until stopped; `peak` is the most seen."""

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.halt = pid, 0, threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.1):
            self.peak = max(self.peak, _threads(self.pid))


def start_server(index: str, log: Path, extra: list[str], cpus: set[int] | None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "drmas_retrieval.cli", "serve", "--index", index, "--port", str(port), *extra]
    with open(log, "w") as fh:  # a file, not a pipe: a pipe nobody drains would block the server's logging
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=fh, preexec_fn=lambda: _pin(cpus))
    return proc, wait_healthy(proc, f"http://127.0.0.1:{port}")


def peak_rss(pid: int) -> int:
    """VmHWM of a process: the most it has held resident, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def probe(url: str) -> dict[str, int]:
    host, port = url.removeprefix("http://").split(":")
    out = {}
    for name, tail in PROBES.items():
        status = 0
        for _ in range(50):  # a flood may hold every connection slot: retry a 503 at connect
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + tail)
                try:
                    status = int(sock.recv(64).split()[1])
                except (OSError, IndexError, ValueError):
                    status = 0
            if status != 503:
                break
            time.sleep(0.2)
        out[name] = status
    return out


def ordinary(url: str, session: requests.Session, qs: list[str], stop: float, limit: int) -> dict:
    """One keep-alive client's latencies (s) until `stop` or `limit` requests; 503s retried."""
    lat, retries, failures = [], 0, 0
    i = 0
    while time.time() < stop and i < limit:
        t = time.perf_counter()
        while True:
            try:
                reply = session.post(f"{url}/retrieve", json={"query": qs[i % len(qs)], "topk": 3}, timeout=120)
                status = reply.status_code
            except requests.RequestException:
                status = 0
            if status == 200:
                break
            retries += 1
            if status not in (0, 503):
                failures += 1
                break
            time.sleep(0.1)
        lat.append(time.perf_counter() - t)
        i += 1
    ms = np.array(lat) * 1000
    return {"requests": len(lat), "retries": retries, "failures": failures, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max())}  # fmt: skip


def run(index: str, mix: tuple[str, ...], args: argparse.Namespace) -> dict:
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    log = Path(index).parent / "server.log"
    cpus = sorted(os.sched_getaffinity(0))
    attack_cpus, serve_cpus = ({cpus[0]}, set(cpus[1:])) if args.pin and len(cpus) > 1 else (None, None)
    proc, url = start_server(index, log, args.serve_args.split(), serve_cpus)
    mine = os.sched_getaffinity(0)
    sampler = PeakThreads(proc.pid)
    sampler.start()
    try:
        bound = requests.get(f"{url}/health", timeout=10).json()["memory_bound_bytes"]
        session = requests.Session()
        session.get(f"{url}/health", timeout=10)  # the ordinary client's connection, open before the flood
        qs = questions()
        cpu0 = cpu_seconds(proc.pid)
        if not mix:
            result = ordinary(url, session, qs, time.time() + args.seconds, args.baseline_requests)
            counts: dict = {}
        else:
            stop = time.time() + args.seconds
            with ProcessPoolExecutor(len(mix), initializer=_pin, initargs=(attack_cpus,)) as pool:
                futures = {k: pool.submit(_attack, k, url, args.idle if k == "idle" else args.clients, stop, args.hold)
                           for k in mix}  # fmt: skip
                _pin(serve_cpus)  # the ordinary client runs beside the server
                time.sleep(args.warmup)
                result = ordinary(url, session, qs, stop, 10**9)
                counts = {k: f.result() for k, f in futures.items()}
        server_cpu = cpu_seconds(proc.pid) - cpu0
        by_thread = thread_cpu(proc.pid)
        health = requests.get(f"{url}/health", timeout=60).json()
        return {"mix": "+".join(mix) or "none (unloaded)", "uptime": uptime, "peak_rss": peak_rss(proc.pid),
                "bound": bound, **result, "attackers": counts, "probes": probe(url), "health": health,
                "peak_threads": sampler.peak, "server_cpu_s": round(server_cpu, 1), "server_cpu_by_thread": by_thread,
                "pinned": attack_cpus is not None}  # fmt: skip
    finally:
        os.sched_setaffinity(0, mine)
        sampler.halt.set()
        proc.terminate()
        proc.wait(30)
        print(log.read_text()[-2000:], flush=True)  # the stated bound, and any error the server logged


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hostile", action="store_true", help="(how service_load selects this benchmark)")
    parser.add_argument("--clients", type=int, default=300, help="clients per hostile mix")
    parser.add_argument("--seconds", type=float, default=30, help="length of each mix")
    parser.add_argument("--warmup", type=float, default=5, help="seconds of each mix before the ordinary client")
    parser.add_argument("--idle", type=int, default=3000, help="connections of the idle mix")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="attackers on one core, server and ordinary client on the others (a model of remote attackers)",
    )
    parser.add_argument("--hold", type=float, default=35, help="seconds a non-reading client keeps its socket")
    parser.add_argument("--baseline-requests", type=int, default=300, help="ordinary requests, unloaded")
    parser.add_argument("--p99-multiple", type=float, default=100, help="the stated multiple of unloaded p99")
    parser.add_argument("--serve-args", default="", help="extra flags for `drmas-retrieval serve`")
    parser.add_argument("--mixes", default="all", help="all, or comma-separated mix numbers 1-5")
    parser.add_argument("--out", type=Path, default=OUT, help="the Markdown report (and .json beside it)")
    args = parser.parse_args(argv)
    from drmas_envs.search.retrievers import build_index

    mixes = MIXES if args.mixes == "all" else [MIXES[int(i) - 1] for i in args.mixes.split(",")]
    corpus = DATA / "corpus" / "wiki_passages.jsonl.gz"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if not corpus.is_file():
            corpus = world_corpus(Path(tmp) / "world.jsonl")
        index = str(build_index(corpus, "bm25", Path(tmp) / "index"))
        for mix in [(), *mixes, ()]:  # unloaded before and after: the other jobs' load drifts
            rows.append(run(index, mix, args) | ({"mix": "none (unloaded, after)"} if rows and not mix else {}))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "health"}), flush=True)
    args.out.write_text("\n".join(report(rows, args, corpus.name)) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"machine": cpu_line(), "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
