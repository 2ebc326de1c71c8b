"""The service under hostile clients, on real loopback sockets: every bound holds and the service keeps serving.

Deadlines in these tests are short so that they run fast, but nothing asserts a duration: each test
checks what happened first (a connection cut before its dribble ended, a short query served before a
heavy request's last chunk) or polls a gauge the server reports until it settles.
"""

import http.client
import json
import logging
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from unittest.mock import ANY

import pytest
import requests
from search_helpers import write_toy

from drmas_envs.search.retrievers import build_index, load_index
from drmas_retrieval import SERVERS, ServiceConfig, serve_in_thread
from drmas_retrieval.config import BODY_FACTOR, memory_bound


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    root = tmp_path_factory.mktemp("limits")
    corpus, _ = write_toy(root)
    return str(build_index(corpus, "bm25", root / "index"))


@pytest.fixture
def serve(index):
    started = []

    def start(retriever=None, server="stdlib", **limits):
        srv, thread = serve_in_thread(retriever or load_index(index), ServiceConfig(port=0, **limits), server)
        started.append((srv, thread))
        return srv

    yield start
    for srv, thread in started:
        srv.shutdown()
        srv.server_close()
        thread.join(10)


def health(srv):
    while (reply := requests.get(f"{srv.url}/health", timeout=10)).status_code == 503:  # every slot held
        time.sleep(0.05)
    return reply.json()


def settles(srv, **want):
    """Poll /health until every `want` gauge has its value (the server frees things on its own threads)."""
    for _ in range(600):
        got = health(srv)
        if all(got[k] == v for k, v in want.items()):
            return got
        time.sleep(0.05)
    raise AssertionError(f"/health never reached {want}: {got}")


def ask_ok(srv):
    reply = requests.post(f"{srv.url}/retrieve", json={"query": "Ulm", "topk": 1}, timeout=10)
    return reply.status_code == 200 and reply.json()["result"][0][0]["id"] == "p5"


def raw(srv, data: bytes) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it."""
    with socket.create_connection(srv.server_address[:2], timeout=10) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


def test_connections_over_the_cap_get_503_at_once_and_slots_come_back(serve):
    srv = serve(max_connections=3)
    held = [http.client.HTTPConnection(*srv.server_address[:2], timeout=10) for _ in range(3)]
    for conn in held:  # each connection is being served: its thread holds a slot
        conn.request("GET", "/health")
        assert conn.getresponse().read()
    reply = raw(srv, b"")
    assert reply.startswith(b"HTTP/1.1 503") and b"too many open connections" in reply
    held.pop().close()
    served = False
    for _ in range(600):  # the slot frees when its thread sees the close (asking twice in a row can race it)
        if served := ask_ok(srv):
            break
        time.sleep(0.05)
    assert served
    for conn in held:
        conn.close()
    assert health(srv)["refused"] >= 1


def test_a_header_dribble_is_cut_by_its_deadline_not_kept_alive_by_each_byte(serve):
    srv = serve(header_timeout=0.5, idle_timeout=30)
    steps = 400  # one byte each 50 ms: a per-read timeout of 30 s would never fire
    with socket.create_connection(srv.server_address[:2], timeout=10) as sock:
        sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        sent = 0
        while sent < steps:
            try:
                sock.sendall(b"a")
            except OSError:
                break
            sent += 1
            if select.select([sock], [], [], 0.05)[0]:
                try:
                    if not sock.recv(1024):
                        break
                except ConnectionResetError:
                    break
    assert sent < steps, "the server kept a dribbling connection for the whole dribble"
    assert settles(srv, deadline_drops=1)["connections"] == 1
    assert ask_ok(srv)


def test_a_stalled_body_is_dropped_and_its_reservation_freed(serve):
    srv = serve(body_timeout=3)
    with socket.create_connection(srv.server_address[:2], timeout=10) as sock:
        sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n" + b" " * 1000)
        settles(srv, buffered_bytes=BODY_FACTOR * 1_000_000)  # reserved while the body is read
        settles(srv, deadline_drops=1)
        assert sock.recv(1024) == b""  # closed, without a reply
    settles(srv, buffered_bytes=0, connections=1)
    assert ask_ok(srv)


@pytest.fixture(scope="module")
def big_index(tmp_path_factory):
    """40 passages of ~32 KB that all match 'alpha': ten queries at topk 40 make a ~13 MB reply."""
    root = tmp_path_factory.mktemp("big")
    rows = [{"id": f"b{i}", "title": f"B{i}", "text": f"alpha w{i} " + "x" * 32_000} for i in range(40)]
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(build_index(corpus, "bm25", root / "index"))


def test_a_client_that_does_not_read_is_dropped_and_its_reply_freed(serve, big_index):
    srv = serve(load_index(big_index), write_timeout=0.5)
    body = json.dumps({"queries": ["alpha"] * 10, "topk": 40}).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little of the reply for us
    sock.connect(srv.server_address[:2])
    sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    settles(srv, deadline_drops=1)
    settles(srv, buffered_bytes=0, connections=1)  # its thread ended and its reply was released
    received = b""
    sock.settimeout(10)
    try:
        while chunk := sock.recv(1 << 20):
            received += chunk
    except ConnectionResetError:
        pass
    sock.close()
    head, _, rest = received.partition(b"\r\n\r\n")
    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    assert head.startswith(b"HTTP/1.1 200") and length > 4 << 20 and len(rest) < length  # cut short
    reply = requests.post(f"{srv.url}/retrieve", json={"query": "alpha w3", "topk": 1}, timeout=10)
    assert reply.json()["result"][0][0]["id"] == "b3"


def framed(body: bytes, headers: bytes | None = None) -> bytes:
    head = b"POST /retrieve HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    return head + (headers or b"Content-Length: %d\r\n" % len(body)) + b"\r\n" + body


ULM = b'{"query": "Ulm"}'


@pytest.mark.parametrize("server_kind", SERVERS)
@pytest.mark.parametrize(
    "request_bytes,message",
    [
        (framed(b"[" * 100_000 + b"]" * 8), b"nested too deeply"),
        (framed(b'{"query": "x", "topk": ' + b"7" * 5000 + b"}"), b"integer of 5000"),
        (framed(b'{"query": NaN}'), b"NaN is not a JSON number"),
        (framed(ULM, b"Transfer-Encoding: gzip, chunked\r\nContent-Length: 16\r\n"), b"ambiguous framing"),
        (framed(ULM + b" ", b"Content-Length: 16\r\nContent-Length: 17\r\n"), b"ambiguous framing"),
        (framed(ULM, b"Content-Length: 1_6\r\n"), b"malformed Content-Length"),
    ],
    ids=["deep-json", "huge-int", "nan", "te-and-cl", "two-cl", "cl-underscore"],
)
def test_hostile_bodies_and_framing_get_400_and_the_service_keeps_serving(serve, server_kind, request_bytes, message):
    srv = serve(server=server_kind)
    reply = raw(srv, request_bytes)
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    if server_kind == "stdlib":  # uvicorn may refuse bad framing itself, with its own message
        assert message in reply, reply[:300]
    assert ask_ok(srv)


@pytest.mark.parametrize(
    "limits,payload,status,message",
    [
        ({"max_hits": 100}, {"queries": ["a"] * 20, "topk": 10}, 413, "hits; the limit is 100"),
        ({"max_request_chars": 4096}, {"queries": ["a" * 3000] * 2}, 413, "the limit is 4096"),
        ({"max_reply_bytes": 300}, {"queries": ["Warsaw", "physicist"], "topk": 3}, 413, "exceed 300 bytes"),
    ],
)
def test_per_request_work_caps_are_413(serve, limits, payload, status, message):
    srv = serve(**limits)
    reply = requests.post(f"{srv.url}/retrieve", json=payload, timeout=10)
    assert reply.status_code == status and message in reply.json()["error"]
    assert settles(srv, buffered_bytes=0)["pending"] == 0
    assert ask_ok(srv)


class Recording:
    """The real BM25 retriever, recording each call's queries; calls wait for `gate` (set it to run)."""

    def __init__(self, inner):
        self.inner, self.calls, self.gate = inner, [], threading.Event()

    def search(self, queries, k):
        self.calls.append(list(queries))
        self.gate.wait(30)
        return self.inner.search(queries, k)


def test_a_heavy_request_is_split_and_a_later_short_one_goes_ahead_of_its_rest(serve, index):
    retriever = Recording(load_index(index))
    srv = serve(retriever, max_batch_chars=4096)
    heavy = ["Danube river city " * 220] * 20  # 3,960 characters each: one query per retriever call
    post = lambda q: requests.post(f"{srv.url}/retrieve", json={"queries": q, "topk": 3}, timeout=60)  # noqa: E731
    with ThreadPoolExecutor(2) as pool:
        heavy_reply = pool.submit(post, heavy)
        while not retriever.calls:  # the worker is inside the heavy request's first call
            time.sleep(0.01)
        short_reply = pool.submit(post, ["Marie Curie"])
        while srv.batcher.pending < 21:  # 19 heavy queries queued + 1 in the call + the short one
            time.sleep(0.01)
        retriever.gate.set()
        assert short_reply.result().json()["result"][0][0]["id"] == "p1"
        assert [hits[0]["id"] for hits in heavy_reply.result().json()["result"]] == ["p5"] * 20
    where = {q: i for i, call in enumerate(retriever.calls) for q in call}
    assert all(len(call) <= 2 and sum(map(len, call)) <= 4096 for call in retriever.calls)
    assert len(retriever.calls) >= 20  # the heavy request went out in chunks, not as one call
    assert where["Marie Curie"] == 1  # the very next call after the one in flight, not after all 20


def test_a_client_over_its_queue_cap_gets_503_while_another_is_queued(serve, index):
    retriever = Recording(load_index(index))
    srv = serve(retriever, max_pending_per_client=600, client_key="ip")
    host, port = srv.server_address[:2]

    def post(queries, source="127.0.0.1"):
        conn = http.client.HTTPConnection(host, port, timeout=30, source_address=(source, 0))
        conn.request("POST", "/retrieve", body=json.dumps({"queries": queries, "topk": 1}))
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read())

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, ["Ulm"] * 512)
        while srv.batcher.pending < 512:
            time.sleep(0.01)
        status, body = post(["Ulm"] * 100)  # the same address: 612 would be queued
        assert status == 503 and "this client has 512 queries waiting" in body["error"]
        other = pool.submit(post, ["Marie Curie"], "127.0.0.2")  # another address is queued, not refused
        while srv.batcher.pending < 513:
            time.sleep(0.01)
        retriever.gate.set()
        assert first.result()[0] == 200
        assert other.result() == (200, {"result": [[{"id": "p1", "contents": ANY}]]})
    assert ask_ok(srv)


def test_the_memory_bound_is_stated_at_start_and_grows_with_the_caps(serve, caplog):
    caplog.set_level(logging.INFO, logger="drmas_retrieval.server")
    srv = serve(max_connections=10)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("memory bound")]
    assert len(lines) == 1 and "MiB" in lines[0] and "connections" in lines[0]
    assert health(srv)["memory_bound_bytes"] == srv.bound.total
    small, large = ServiceConfig(max_connections=10), ServiceConfig(max_connections=20)
    assert memory_bound(large, 0).connections == 2 * memory_bound(small, 0).connections
    assert memory_bound(ServiceConfig(buffer_bytes=2 << 20), 0).buffers == 2 << 20


def test_a_request_whose_client_left_gives_up_its_queued_queries(serve, index):
    retriever = Recording(load_index(index))
    srv = serve(retriever)
    with ThreadPoolExecutor(1) as pool:
        blocker = pool.submit(requests.post, f"{srv.url}/retrieve", json={"query": "Ulm"}, timeout=30)
        while not retriever.calls:  # the worker is inside the blocker's call
            time.sleep(0.01)
        body = json.dumps({"queries": ["abandoned question", "abandoned too"]}).encode()
        with socket.create_connection(srv.server_address[:2], timeout=10) as sock:
            sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            while srv.batcher.pending < 3:
                time.sleep(0.01)
        settles(srv, pending=1)  # the closed client's queries left the queue while the call was still blocked
        retriever.gate.set()
        assert blocker.result().status_code == 200
    assert not any(q.startswith("abandoned") for call in retriever.calls for q in call)
