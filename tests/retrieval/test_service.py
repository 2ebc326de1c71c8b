"""The retrieval service on 127.0.0.1: protocol, bad requests, batching, failures, env equivalence, CLI.

Every service test runs against both front ends (stdlib and asgi) on real loopback ports.
"""

import asyncio
import http.client
import json
import logging
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from unittest.mock import ANY

import pytest
import requests
from search_helpers import write_toy

import drmas_envs
from drmas_envs.search.retrievers import HTTPRetriever, RetrievalServiceError, build_index, load_index
from drmas_retrieval import SERVERS, Batcher, ServiceConfig, serve_in_thread
from drmas_retrieval.cli import main as cli_main


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("svc")
    corpus, questions = write_toy(root)
    index = build_index(corpus, "bm25", root / "index")
    return {"corpus": corpus, "dataset": questions, "index": str(index)}


@pytest.fixture(scope="module", params=SERVERS)
def service(toy, request):
    retriever = load_index(toy["index"])
    server, thread = serve_in_thread(retriever, ServiceConfig(port=0), server=request.param)
    yield server, retriever
    server.shutdown()
    server.server_close()
    thread.join(10)
    assert not thread.is_alive()


def post(url, body, **kw):
    return requests.post(
        f"{url}/retrieve", data=body if isinstance(body, bytes) else json.dumps(body), timeout=10, **kw
    )


def test_protocol_shapes(service):
    server, retriever = service
    reply = post(server.url, {"queries": ["physicist Marie Curie", "Danube"], "topk": 2, "return_scores": True}).json()
    assert len(reply["result"]) == 2 and len(reply["result"][0]) == 2 and len(reply["result"][1]) == 1
    hit = reply["result"][0][0]
    assert hit["document"] == {
        "id": "p1",
        "contents": '"Marie Curie"\nMarie Curie was a physicist and chemist born in Warsaw.',
    }
    assert hit["score"] == pytest.approx(retriever.search(["physicist Marie Curie"], 1)[0][0].score)
    plain = post(server.url, {"query": "Danube"}).json()["result"]  # Search-R1: without scores, bare documents
    assert plain == [[{"id": "p5", "contents": '"Ulm"\nUlm is a city in Germany on the Danube.'}]]
    health = requests.get(f"{server.url}/health", timeout=5).json()
    assert health["status"] == "ok" and health["queries"] >= 3


@pytest.mark.parametrize(
    "body,status,message",
    [
        (b"{not json", 400, "not valid JSON"),
        (b'["a list"]', 400, "JSON object"),
        ({"topk": 3}, 400, "give 'queries'"),
        ({"queries": []}, 400, "give 'queries'"),
        ({"queries": ["ok", 7]}, 400, "must be a string"),
        ({"query": "x", "topk": 10**9}, 400, "'topk' must be"),
        ({"query": "x", "topk": True}, 400, "'topk' must be"),
        ({"query": "x", "return_scores": "yes"}, 400, "return_scores"),
        ({"queries": ["x"] * 513}, 413, "limit is 512"),
        ({"query": "x" * 5000}, 413, "limit is 4096"),
        (b"x" * (10 << 20), 413, "the limit is 1048576"),
    ],
)
def test_bad_requests_get_4xx_and_service_keeps_serving(service, body, status, message):
    server, _ = service
    reply = post(server.url, body)
    assert reply.status_code == status and message in reply.json()["error"]
    assert post(server.url, {"query": "Ulm"}).json()["result"][0][0]["id"] == "p5"


def test_wrong_path_method_and_framing(service):
    server, _ = service
    for reply in (requests.get(f"{server.url}/nope", timeout=5), requests.post(f"{server.url}/nope", data=b"{}")):
        assert reply.status_code == 404 and "use POST /retrieve or GET /health" in reply.json()["error"]
    assert requests.get(f"{server.url}/retrieve", timeout=5).status_code == 404
    put = requests.put(f"{server.url}/retrieve", data=b"{}", timeout=5)
    assert put.status_code == 405 and "PUT not allowed" in put.json()["error"]
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=5)
    conn.putrequest("POST", "/retrieve")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    conn.send(b"0\r\n\r\n")
    reply = conn.getresponse()
    assert reply.status == 411 and "not chunked" in json.loads(reply.read())["error"]
    conn.close()
    conn = http.client.HTTPConnection(host, port, timeout=5)
    conn.putrequest("POST", "/retrieve")  # no Content-Length at all
    conn.endheaders()
    reply = conn.getresponse()
    assert reply.status == 411 and "Content-Length header is required" in json.loads(reply.read())["error"]
    conn.close()
    assert requests.get(f"{server.url}/health", timeout=5).status_code == 200


def test_keep_alive_connection_survives_bad_requests(service):
    server, _ = service
    conn = http.client.HTTPConnection(*server.server_address[:2], timeout=10)
    conn.connect()
    sock = conn.sock  # http.client drops (None) its socket when a reply says the connection closes

    def ask(body: bytes) -> tuple[int, dict]:
        conn.request("POST", "/retrieve", body=body, headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        return reply.status, json.loads(reply.read())

    for body, status in ((b"{not json", 400), (b'{"query": "x", "topk": 0}', 400), (b"y" * (2 << 20), 413)):
        assert ask(body)[0] == status
        assert ask(b'{"query": "Ulm", "topk": 1}') == (200, {"result": [[{"id": "p5", "contents": ANY}]]})
        assert conn.sock is sock
    conn.close()


def test_concurrent_clients_all_answered_correctly(service):
    server, retriever = service
    queries = ["Marie Curie", "capital of France", "Danube", "physicist", "Vistula river", "Ulm"]
    expected = {q: [p.id for p in retriever.search([q], 3)[0]] for q in queries}

    def client(i):
        session = requests.Session()
        for j in range(5):
            q = queries[(i + j) % len(queries)]
            reply = session.post(f"{server.url}/retrieve", json={"queries": [q], "topk": 3}, timeout=30)
            assert reply.status_code == 200
            assert [d["id"] for d in reply.json()["result"][0]] == expected[q]
        return True

    with ThreadPoolExecutor(40) as pool:
        assert all(pool.map(client, range(40)))


class GatedRetriever:
    """Blocks its first call until released, so later requests pile up; records each call's batch."""

    def __init__(self):
        self.gate, self.calls = threading.Event(), []

    def search(self, queries, k):
        self.calls.append(list(queries))
        self.gate.wait(10)
        if "boom" in queries:
            raise RuntimeError("index exploded")
        return [[] for _ in queries]


def test_batcher_drains_pending_requests_into_one_call():
    retriever = GatedRetriever()
    batcher = Batcher(retriever, max_batch=100)
    with ThreadPoolExecutor(9) as pool:
        futures = [pool.submit(batcher.submit, ["q0"], 3, 10)]
        while not retriever.calls:  # the worker is now blocked inside the first call
            threading.Event().wait(0.01)
        futures += [pool.submit(batcher.submit, [f"q{i}"], 3, 10) for i in range(1, 9)]
        while batcher.pending < 9:
            threading.Event().wait(0.01)
        retriever.gate.set()
        assert all(f.result() == [[]] for f in futures)
    assert retriever.calls[0] == ["q0"] and sorted(retriever.calls[1]) == [f"q{i}" for i in range(1, 9)]
    assert batcher.batches == 2 and batcher.queries == 9
    batcher.close()


class SteppedRetriever:
    """Each call waits for its own release; `calls` lists each call's queries as it starts."""

    def __init__(self):
        self.calls, self.steps = [], threading.Semaphore(0)

    def search(self, queries, k):
        self.calls.append(list(queries))
        self.steps.acquire(timeout=10)
        return [[] for _ in queries]


def test_a_newly_active_client_goes_in_the_next_call_ahead_of_other_clients_expensive_queries():
    retriever = SteppedRetriever()
    batcher = Batcher(retriever, max_batch_chars=100)

    def until(ready):
        while not ready():
            threading.Event().wait(0.01)

    with ThreadPoolExecutor(13) as pool:
        futures = [pool.submit(batcher.submit, ["first"], 1, 30)]
        until(lambda: retriever.calls)  # the worker is blocked inside the first call
        futures += [pool.submit(batcher.submit, ["h" * 100] * 3, 1, 30, client=f"heavy{i}") for i in range(10)]
        futures.append(pool.submit(batcher.submit, ["l" * 5] * 40, 1, 30, client="light"))
        until(lambda: batcher.pending == 71)
        retriever.steps.release()
        until(lambda: len(retriever.calls) == 2)  # cheap queries advanced the virtual time: a new client arrives
        futures.append(pool.submit(batcher.submit, ["who directed it?"], 1, 30, client="ordinary"))
        until(lambda: batcher.pending == 71)
        retriever.steps.release(100)
        assert all(f.result() is not None for f in futures)
    ordinary = next(i for i, call in enumerate(retriever.calls) if "who directed it?" in call)
    assert ordinary == 2, retriever.calls[:ordinary]  # the call after the one running when it arrived
    batcher.close()


def test_async_and_thread_submissions_share_batches_and_time_out_cleanly(caplog):
    caplog.set_level(logging.ERROR)
    retriever = GatedRetriever()
    batcher = Batcher(retriever, max_batch=100)

    async def scenario():
        first = asyncio.create_task(batcher.asubmit(["a0"], 3, 10))
        while not retriever.calls:  # the worker is blocked inside the first call
            await asyncio.sleep(0.01)
        waiters = [asyncio.create_task(batcher.asubmit([f"a{i}"], 3, 10)) for i in range(1, 4)]
        threaded = asyncio.create_task(asyncio.to_thread(batcher.submit, ["t"], 3, 10))
        with pytest.raises(TimeoutError, match="no answer within"):
            await batcher.asubmit(["late"], 3, timeout=0.05)
        while batcher.pending < 5:  # "late" gave its place up
            await asyncio.sleep(0.01)
        retriever.gate.set()
        return await asyncio.gather(first, *waiters, threaded)

    assert asyncio.run(scenario()) == [[[]]] * 5
    assert retriever.calls[0] == ["a0"]
    assert sorted(retriever.calls[1]) == ["a1", "a2", "a3", "t"]  # the timed-out job gave up its place
    assert batcher.submit(["after"], 3, 10) == [[]]  # the worker survived answering a waiter that gave up
    assert not caplog.records  # nor did waking the timed-out waiter raise inside the event loop
    batcher.close()


@pytest.mark.parametrize("server_kind", SERVERS)
def test_overload_is_a_503_and_the_service_recovers(server_kind):
    retriever = GatedRetriever()
    server, _ = serve_in_thread(retriever, ServiceConfig(port=0, max_pending=1), server=server_kind)
    try:
        with ThreadPoolExecutor(1) as pool:
            blocked = pool.submit(post, server.url, {"query": "first"})
            while not retriever.calls:
                threading.Event().wait(0.01)
            busy = post(server.url, {"query": "second"})
            assert busy.status_code == 503 and "busy, retry later" in busy.json()["error"]
            retriever.gate.set()
            assert blocked.result().json() == {"result": [[]]}
        assert post(server.url, {"query": "third"}).json() == {"result": [[]]}
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("server_kind", SERVERS)
def test_retriever_failure_is_a_500_and_the_service_survives(server_kind):
    retriever = GatedRetriever()
    retriever.gate.set()
    server, _ = serve_in_thread(retriever, ServiceConfig(port=0), server=server_kind)
    try:
        bad = post(server.url, {"query": "boom"})
        assert bad.status_code == 500 and "index exploded" in bad.json()["error"]
        assert post(server.url, {"query": "fine"}).json() == {"result": [[]]}
        with pytest.raises(RetrievalServiceError, match="HTTP 500"):
            HTTPRetriever(server.url, retries=1, backoff=0.01).search(["boom"], 3)
        with pytest.raises(RetrievalServiceError, match="refused the request: HTTP 400"):
            HTTPRetriever(server.url).search(["x"], 10**6)
    finally:
        server.shutdown()
        server.server_close()


def test_client_reports_a_down_service_clearly():
    with pytest.raises(
        RetrievalServiceError, match=r"127.0.0.1:9/retrieve failed after 3 attempts.*drmas-retrieval serve"
    ):
        HTTPRetriever("http://127.0.0.1:9", retries=2, backoff=0.01, timeout=2).search(["q"], 3)


@pytest.mark.parametrize("env_id", ["search-1agent", "search-2agent", "search-3agent"])
def test_env_over_service_sees_the_same_observations(service, toy, env_id):
    server, _ = service
    common = {"dataset": toy["dataset"], "corpus": toy["corpus"], "index_dir": toy["index"]}
    local = drmas_envs.make(env_id, **common)
    remote = drmas_envs.make(env_id, dataset=toy["dataset"], retriever=server.url)
    actions = {
        "verifier": ["<verify>no</verify>"] * 3,
        "search": ["<search>Marie Curie</search>", "<search>Warsaw river</search>", "<done>"],
        "searcher": ["<search>Marie Curie</search>", "<search>Warsaw river</search>", "<answer>Vistula</answer>"],
        "answer": ["<answer>Vistula</answer>"],
    }
    for task in range(2):
        for env in (local, remote):
            env.reset(options={"task_index": task})
        script = {a: list(v) for a, v in actions.items()}
        while not all(local.terminations.values()):
            agent = local.agent_selection
            assert remote.agent_selection == agent
            assert remote.observe(agent) == local.observe(agent)
            action = script[agent].pop(0)
            local.step(action)
            remote.step(action)
        assert remote.rewards == local.rewards and remote.infos == local.infos
        assert local.infos[agent]["n_searches"] >= 1


@pytest.mark.parametrize("server_kind", SERVERS)
def test_cli_build_and_serve(toy, tmp_path, server_kind):
    exe = [sys.executable, "-m", "drmas_retrieval.cli"]
    out = tmp_path / "cli-index"
    subprocess.run([*exe, "build", "--corpus", toy["corpus"], "--retriever", "bm25", "--out", str(out)], check=True)
    assert (out / "meta.json").is_file()
    serve = [*exe, "serve", "--server", server_kind, "--port", "0", "--index"]
    bad = subprocess.run([*serve, str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 2 and "not an index folder" in bad.stdout
    proc = subprocess.Popen([*serve, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert f"{server_kind} server" in line
        url = re.search(r"http://127\.0\.0\.1:\d+", line).group(0)
        assert post(url, {"query": "Marie Curie", "topk": 1}).json()["result"][0][0]["id"] == "p1"
        assert post(url, b"{not json").status_code == 400
    finally:
        proc.terminate()
        proc.wait(10)


def test_cli_rejects_an_unknown_server_at_parse_time(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["serve", "--index", "idx", "--server", "flask"])
    assert exit_info.value.code == 2 and "invalid choice: 'flask'" in capsys.readouterr().err


def test_cli_asgi_without_the_extra_says_what_to_install(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if drmas-retrieval[asgi] were not installed
    monkeypatch.delitem(sys.modules, "drmas_retrieval.asgi", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["serve", "--index", str(tmp_path), "--server", "asgi"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 2 and "pip install 'drmas-retrieval[asgi]'" in out and "uvicorn" in out
