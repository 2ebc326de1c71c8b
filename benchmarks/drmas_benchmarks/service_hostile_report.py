"""The Markdown report of drmas_benchmarks.service_hostile: one row per mix, then what each side saw."""

from __future__ import annotations

import argparse
import json
import sys

from drmas_benchmarks.machine import cpu_line
from drmas_retrieval.config import ServiceConfig

OWN_THREADS = 2
"""Threads the server runs besides its connection handlers: the accept loop and the batcher's worker."""


def setup(args: argparse.Namespace, corpus: str) -> str:
    where = (
        "The attackers' processes run pinned to one core (os.sched_setaffinity), the server and the ordinary "
        "client to the other: a model of attackers on other machines, who would not take the server's CPU. "
        "Other jobs on the machine are not pinned."
        if args.pin
        else "Server, attackers and the ordinary client share the machine's cores."
    )
    return (
        f"`drmas-retrieval serve {args.serve_args or '(default flags)'}` (BM25 over {corpus}), restarted for each "
        f"mix. Each hostile mix is {args.clients} clients in its own process for {args.seconds:.0f} s (the idle mix: "
        f"{args.idle} connections opened at once, kept open and silent); the ordinary client is one keep-alive "
        f"session sending one-question requests (topk 3) back to back from {args.warmup:.0f} s into the mix, a 503 "
        f"retried after 0.1 s (latency counted until the 200). {where}"
    )


def report(rows: list[dict], args: argparse.Namespace, corpus: str) -> list[str]:
    base = min(r["p99_ms"] for r in rows if not r["attackers"] and r["mix"].startswith("none"))
    cap = ServiceConfig().max_connections
    mib = lambda n: f"{n / (1 << 20):,.0f}"  # noqa: E731
    lines = [
        "# Retrieval service under hostile clients (loopback)",
        "",
        setup(args, corpus),
        "",
        f"Rule: peak RSS under the bound the service states, and the ordinary client's p99 within "
        f"{args.p99_multiple:g}x its unloaded p99 (the lower of the unloaded runs before and after, the stricter "
        "test: other jobs' load moves it). Handler threads: the server's peak thread count less its "
        f"{OWN_THREADS} own, against its connection cap ({cap}, default flags); a handler whose connection has "
        "closed is uncounted as it exits, so the peak can pass the cap by the handlers exiting at that moment.",
        "",
        "| mix | peak RSS MiB | stated bound MiB | under bound | peak handler threads | server CPU s "
        "| ordinary requests | p50 ms | p99 ms | p99 / unloaded p99 | within rule | 503 retries | probes (status) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r["p99_ms"] / base
        lines.append(
            f"| {r['mix']} | {mib(r['peak_rss'])} | {mib(r['bound'])} | {r['peak_rss'] < r['bound']} "
            f"| {r['peak_threads'] - OWN_THREADS} | {r['server_cpu_s']:.1f} "
            f"| {r['requests']} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {ratio:.1f} "
            f"| {ratio <= args.p99_multiple} | {r['retries']} | {', '.join(map(str, r['probes'].values()))} |"
        )
    lines += ["", f"Probes, in order: {', '.join(rows[0]['probes'])}.", ""]
    for r in rows:
        if r["mix"] == "idle":
            seen = r["attackers"]["idle"]
            lines.append(
                f"Idle connections: of {seen.get('connections', 0)} opened, {seen.get('503', 0)} got 503 (the "
                f"slowest {seen.get('503 slowest ms', 0):.0f} ms after its connect) and "
                f"{seen.get('open at the end', 0)} stayed open and idle; the server peaked at "
                f"{r['peak_threads'] - OWN_THREADS} handler threads and {mib(r['peak_rss'])} MiB resident."
            )
            lines.append("")
    lines += ["What the attackers saw (`CPU s`: the CPU time of the attackers' process):", ""]
    lines += [f"- {r['mix']}: `{json.dumps(r['attackers'])}`" for r in rows if r["attackers"]]
    lines += ["", "Server CPU seconds by thread over the whole run (main: accepts and refusals; busiest other: "
              "the batcher's worker; rest: connection handlers):", ""]  # fmt: skip
    lines += [f"- {r['mix']}: `{json.dumps(r['server_cpu_by_thread'])}`" for r in rows]
    lines += ["", "Server gauges at the end of each mix (/health):", ""]
    lines += [f"- {r['mix']}: `{json.dumps(r['health'])}`" for r in rows]
    lines += ["", "`uptime` before each mix:", ""] + [f"- {r['mix']}: `{r['uptime']}`" for r in rows]
    cmd = " ".join(["python", "-m", "drmas_benchmarks.service_load", *sys.argv[1:]])
    lines += ["", f"Machine: {cpu_line()}, shared with other jobs.", "", f"Reproduce: `.venv/bin/{cmd}`"]
    return lines
