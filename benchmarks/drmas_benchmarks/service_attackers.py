"""Hostile clients for the retrieval service load test, each mix run in its own process until a stop time.

- slowloris: opens a connection, sends a request line, then one header byte per second per connection,
  reconnecting whenever the server drops or refuses it.
- nonreading: sends a valid request at the per-request hit cap and never reads the reply; closes and
  reconnects after `hold` seconds.
- heavy: each client sends, back to back, requests of 20 queries of 4,096 characters of a common term.
- idle: opens many connections at once and sends nothing; counts the 503s the server sends at once.

Every mix counts what happened to it (connections, drops, replies by status) and returns the counts.
"""

from __future__ import annotations

import json
import select
import selectors
import socket
import threading
import time
from collections import Counter

import requests

COMMON = "film "
"""A term of many passages: scoring it touches a long posting list."""


def _connect(addr: tuple[str, int], rcvbuf: int | None = None) -> socket.socket | None:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(5)
    try:
        sock.connect(addr)
    except OSError:
        sock.close()
        return None
    return sock


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed (or refused) this connection; reads what it sent."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return not sock.recv(65536, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return False
    except OSError:
        return True


def slowloris(addr: tuple[str, int], clients: int, stop: float) -> dict:
    """`clients` connections dribbling header bytes, one byte per connection per second."""
    counts: Counter = Counter()
    socks: list[socket.socket | None] = [None] * clients
    while time.time() < stop:
        tick = time.time()
        for i in range(clients):
            sock = socks[i]
            if sock is not None and _closed(sock):
                sock.close()
                sock, counts["closed by server"] = None, counts["closed by server"] + 1
            if sock is None:
                sock = _connect(addr)
                if sock is None:
                    counts["connect failed"] += 1
                    continue
                counts["connections"] += 1
                try:
                    sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                except OSError:
                    sock.close()
                    continue
            try:
                sock.send(b"a", socket.MSG_DONTWAIT)
            except OSError:
                sock.close()
                sock, counts["closed by server"] = None, counts["closed by server"] + 1
            socks[i] = sock
        time.sleep(max(0.0, 1.0 - (time.time() - tick)))
    for sock in socks:
        if sock is not None:
            sock.close()
    return dict(counts)


def nonreading(addr: tuple[str, int], clients: int, stop: float, queries: int, topk: int, hold: float) -> dict:
    """`clients` connections that each send one valid request and never read; replaced every `hold` s."""
    counts: Counter = Counter()
    body = json.dumps({"queries": [f"{COMMON}history {i}" for i in range(queries)], "topk": topk}).encode()
    request = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    socks: list[tuple[socket.socket, float] | None] = [None] * clients
    while time.time() < stop:
        for i in range(clients):
            if socks[i] is not None and time.time() - socks[i][1] < hold:
                continue
            if socks[i] is not None:
                socks[i][0].close()
            sock = _connect(addr, rcvbuf=4096)
            socks[i] = None
            if sock is None:
                counts["connect failed"] += 1
                continue
            try:
                sock.sendall(request)
                counts["requests sent"] += 1
            except OSError:
                counts["send failed"] += 1
            socks[i] = (sock, time.time())
        time.sleep(0.2)
    for entry in socks:
        if entry is not None:
            entry[0].close()
    return dict(counts)


def heavy(url: str, clients: int, stop: float, queries: int = 20, chars: int = 4096) -> dict:
    """`clients` threads sending heavy requests back to back until `stop`."""
    counts: Counter = Counter()
    lock = threading.Lock()
    payload = {"queries": [(COMMON * (chars // len(COMMON) + 1))[:chars]] * queries, "topk": 3}

    def client() -> None:
        session = requests.Session()
        while time.time() < stop:
            try:
                wait = max(1.0, stop - time.time())
                status = str(session.post(f"{url}/retrieve", json=payload, timeout=wait).status_code)
            except requests.RequestException as exc:
                status = type(exc).__name__
            if status != "200":  # refused or failed: wait a little, so 2 cores measure the server, not a spin
                time.sleep(0.2)
            with lock:
                counts[status] += 1

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, stop - time.time()) + 2)
    with lock:  # threads still waiting for a reply are left behind (daemons; the process exits)
        return dict(counts)


def idle(addr: tuple[str, int], clients: int, stop: float) -> dict:
    """`clients` connections opened as fast as they connect, kept open and silent until `stop`."""
    counts: Counter = Counter()
    sel = selectors.DefaultSelector()  # epoll: select() cannot watch descriptors past 1024
    refusal_ms: list[float] = []

    def drain(timeout: float) -> None:
        for key, _ in sel.select(timeout):
            sock, opened = key.fileobj, key.data
            try:
                data = sock.recv(4096, socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            sel.unregister(sock)
            sock.close()
            status = data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/") else "closed by server"
            counts[status] += 1
            if status == "503":
                refusal_ms.append(1000 * (time.monotonic() - opened))

    for _ in range(clients):
        sock = _connect(addr)
        if sock is None:
            counts["connect failed"] += 1
            continue
        counts["connections"] += 1
        sel.register(sock, selectors.EVENT_READ, time.monotonic())
        drain(0)
    while time.time() < stop:
        drain(min(0.5, max(0.0, stop - time.time())))
    counts["open at the end"] = len(sel.get_map())
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    if refusal_ms:
        counts["503 slowest ms"] = round(max(refusal_ms), 1)
    return dict(counts)


def run_mix(kind: str, url: str, clients: int, stop: float, hold: float) -> dict:
    """Run one mix (for a process pool): its counts."""
    host, port = url.removeprefix("http://").split(":")
    addr = (host, int(port))
    if kind == "slowloris":
        return slowloris(addr, clients, stop)
    if kind == "idle":
        return idle(addr, clients, stop)
    if kind == "nonreading":
        return nonreading(addr, clients, stop, queries=512, topk=10, hold=hold)
    return heavy(url, clients, stop)
