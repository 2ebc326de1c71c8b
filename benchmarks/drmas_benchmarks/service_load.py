"""The retrieval service under load on loopback: stdlib vs ASGI front end, 200 concurrent clients.

Serves a BM25 index of ../shared/data/corpus/wiki_passages.jsonl.gz (32,717 passages; the generated
world's corpus if the data is absent) with the real CLI (`drmas-retrieval serve --server S`) in its
own process. The load generator runs in other processes: 4 processes x 50 threads, each thread one
keep-alive `requests.Session` (what `HTTPRetriever` uses) sending a bounded number of single-query
requests (HotpotQA dev questions, topk 3) back to back, and none after `--max-seconds`. A request
fails if it raises or gets anything but 200 with one list of <= 3 hits. After each load run, hostile
requests (malformed JSON, a missing field, topk=10**9, a 10 MB body) must get 4xx and a normal
request must still succeed.

The servers run interleaved (stdlib, asgi, stdlib, asgi, ...) `--rounds` times each, so drifting
background load hits both alike; `uptime` is recorded before each run. Summary: the median over runs
of each server's p99. The default switches only if asgi is clearly better (see RULE).

    .venv/bin/python -m drmas_benchmarks.service_load [--clients 200] [--requests 20] [--rounds 3]

Writes benchmarks/results/service_load.md. With `--hostile`, runs drmas_benchmarks.service_hostile instead
(the service under slowloris, non-reading and heavy clients; see its flags with `--hostile --help`).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from importlib import metadata
from pathlib import Path

import numpy as np
import requests

from drmas_benchmarks.machine import cpu_line

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("DRMAS_DATA_DIR") or ROOT.parent / "shared" / "data")
OUT = ROOT / "benchmarks" / "results" / "service_load.md"
PROCESSES = 4
RULE = "asgi's median p99 at least 20% below stdlib's, with no more failures and no lower median throughput"


def questions(n: int = 2000) -> list[str]:
    path = DATA / "search" / "hotpotqa_dev.jsonl"
    if not path.is_file():
        return [f"question about city {i}" for i in range(n)]
    with open(path) as fh:
        return [json.loads(line)["question"] for _, line in zip(range(n), fh)]


def client_process(url: str, threads: int, n_requests: int, offset: int, deadline: float) -> dict:
    """Run `threads` clients in this process until done or `deadline` (time.time()); latencies in s."""
    qs = questions()
    latencies: list[float] = []
    failures: list[str] = []
    unsent = [0]
    lock = threading.Lock()
    barrier = threading.Barrier(threads)

    def client(i: int) -> None:
        session = requests.Session()
        barrier.wait()
        for j in range(n_requests):
            if time.time() > deadline:
                with lock:
                    unsent[0] += n_requests - j
                return
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
    start = time.time()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return {"lat": latencies, "failures": failures, "unsent": unsent[0], "start": start, "end": time.time()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(index: str, server: str, max_batch: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "drmas_retrieval.cli", "serve", "--index", index, "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--server", server, "--max-batch", str(max_batch)], stdout=subprocess.DEVNULL)
    return proc, wait_healthy(proc, f"http://127.0.0.1:{port}")


def wait_healthy(proc: subprocess.Popen, url: str) -> str:
    """`url` once its /health answers 200 (up to a minute); the process is killed if it never does."""
    for _ in range(600):
        try:
            if requests.get(f"{url}/health", timeout=1).status_code == 200:
                return url
        except requests.ConnectionError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the server at {url} did not start")


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


def run(index: str, server: str, args: argparse.Namespace) -> dict:
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    proc, url = start_server(index, server, args.max_batch)
    try:
        per = args.clients // PROCESSES
        deadline = time.time() + args.max_seconds
        cpu0 = cpu_seconds(proc.pid)
        with ProcessPoolExecutor(PROCESSES) as pool:
            offsets = [p * per * args.requests for p in range(PROCESSES)]
            parts = list(pool.map(client_process, [url] * PROCESSES, [per] * PROCESSES, [args.requests] * PROCESSES,
                                  offsets, [deadline] * PROCESSES))  # fmt: skip
        server_cpu = cpu_seconds(proc.pid) - cpu0
        wall = max(p["end"] for p in parts) - min(p["start"] for p in parts)
        lat = np.array([x for p in parts for x in p["lat"]]) * 1000
        failures = [x for p in parts for x in p["failures"]]
        health = requests.get(f"{url}/health", timeout=10).json()
        return {
            "server": server, "uptime": uptime, "load1": float(uptime.split("load average:")[1].split(",")[0]),
            "clients": per * PROCESSES, "requests": per * PROCESSES * args.requests, "ok": len(lat),
            "failed": len(failures), "unsent": sum(p["unsent"] for p in parts), "failure_examples": failures[:3],
            "wall_s": wall, "rps": len(lat) / wall, "p50_ms": float(np.percentile(lat, 50)),
            "p90_ms": float(np.percentile(lat, 90)), "p99_ms": float(np.percentile(lat, 99)),
            "max_ms": float(lat.max()), "server_cpu_ms_per_req": 1000 * server_cpu / max(len(lat), 1),
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


def summary(rows: list[dict], servers: list[str]) -> tuple[list[str], dict[str, dict]]:
    med = {
        s: {k: statistics.median(r[k] for r in rows if r["server"] == s) for k in ("p50_ms", "p99_ms", "rps")}
        | {"failed": sum(r["failed"] + r["unsent"] for r in rows if r["server"] == s)}
        for s in servers
    }
    lines = ["| server | median p50 ms | median p99 ms | median requests/s | failed + unsent (all runs) |"]
    lines.append("|---|---|---|---|---|")
    lines += [
        f"| {s} | {m['p50_ms']:.0f} | {m['p99_ms']:.0f} | {m['rps']:.0f} | {m['failed']} |" for s, m in med.items()
    ]
    return lines, med


def verdict(med: dict[str, dict]) -> str:
    if not {"stdlib", "asgi"} <= med.keys():
        return "Only one server measured: no comparison."
    a, s = med["asgi"], med["stdlib"]
    change = (a["p99_ms"] - s["p99_ms"]) / s["p99_ms"]
    clearly = change <= -0.20 and a["failed"] <= s["failed"] and a["rps"] >= s["rps"]
    return (
        f"Median p99: asgi {a['p99_ms']:.0f} ms vs stdlib {s['p99_ms']:.0f} ms ({change:+.0%}); median throughput "
        f"asgi {a['rps']:.0f} vs stdlib {s['rps']:.0f} requests/s. Rule for switching the default ({RULE}): "
        + ("met." if clearly else "not met, so stdlib stays the default and asgi an optional extra.")
    )


def versions() -> str:
    names = ("uvicorn", "starlette", "httptools", "uvloop", "requests")
    found = []
    for n in names:
        try:
            found.append(f"{n} {metadata.version(n)}")
        except metadata.PackageNotFoundError:
            found.append(f"{n} absent")
    return ", ".join(found)


def main() -> None:
    if "--hostile" in sys.argv[1:]:  # the hostile-client test: its own module, its own flags
        from drmas_benchmarks.service_hostile import main as hostile

        return hostile(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--requests", type=int, default=20, help="requests per client (a bound)")
    parser.add_argument("--max-seconds", type=float, default=120, help="no new request after this, per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per server, interleaved")
    parser.add_argument("--servers", default="stdlib,asgi", help="comma-separated, run in this order each round")
    parser.add_argument("--max-batch", type=int, default=256, help="1 turns batching off")
    parser.add_argument("--out", type=Path, default=OUT, help="the Markdown report to write")
    parser.add_argument("--append", action="store_true", help="add the report to --out as a section")
    args = parser.parse_args()
    servers = args.servers.split(",")
    from drmas_envs.search.retrievers import build_index

    corpus = DATA / "corpus" / "wiki_passages.jsonl.gz"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if not corpus.is_file():
            corpus = world_corpus(Path(tmp) / "world.jsonl")
        index = str(build_index(corpus, "bm25", Path(tmp) / "index"))
        for rnd in range(1, args.rounds + 1):
            for server in servers:
                rows.append({"round": rnd, **run(index, server, args)})
                print(json.dumps(rows[-1]), flush=True)
    sum_lines, med = summary(rows, servers)
    cmd = " ".join(["python", "-m", "drmas_benchmarks.service_load", *sys.argv[1:]])
    title = "# Retrieval service under load (loopback): stdlib vs ASGI front end"
    if args.append:
        title = f"\n## The same, servers in the order {', '.join(servers)} each round"
    lines = [
        title,
        "",
        f"`drmas-retrieval serve --server S --max-batch {args.max_batch}` (BM25 over {corpus.name}) in its own "
        f"process; the load generator in {PROCESSES} other processes x {rows[0]['clients'] // PROCESSES} threads "
        f"= {rows[0]['clients']} concurrent keep-alive clients, each sending up to {args.requests} one-query "
        f"requests (topk 3) back to back (none after {args.max_seconds:.0f} s). Runs interleaved, "
        f"{args.rounds} per server. Server and clients share the machine's cores.",
        "",
        *sum_lines,
        "",
        verdict(med),
        "",
        "| round | server | 1-min load before | requests | failed | unsent | requests/s | p50 ms | p90 ms | p99 ms "
        "| max ms | server CPU ms / request | mean queries per retriever call |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['round']} | {r['server']} | {r['load1']:.2f} | {r['requests']} | {r['failed']} | {r['unsent']} "
        f"| {r['rps']:.0f} | {r['p50_ms']:.0f} | {r['p90_ms']:.0f} | {r['p99_ms']:.0f} | {r['max_ms']:.0f} "
        f"| {r['server_cpu_ms_per_req']:.2f} | {r['mean_batch']:.1f} |"
        for r in rows
    ]
    lines += ["", "`uptime` before each run:", ""] + [f"- {r['server']} {r['round']}: `{r['uptime']}`" for r in rows]
    lines += ["", "Hostile requests after each load run (status codes; the service kept answering):", ""]
    lines += [f"- {k}: {v}" for k, v in rows[0]["hostile"].items()]
    same = all(r["hostile"] == rows[0]["hostile"] for r in rows)
    lines += [
        f"- identical in all {len(rows)} runs, both servers: {same}",
        "",
        f"Packages: {versions()} (uvicorn picks httptools and uvloop when installed).",
        f"Machine: {cpu_line()}, shared with other jobs (other sessions' tests ran on "
        "the same cores; the load averages above show it).",
        "",
        f"Reproduce: `.venv/bin/{cmd}`",
    ]
    with open(args.out, "a" if args.append else "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
