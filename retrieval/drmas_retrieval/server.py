"""The HTTP front end: Search-R1's POST /retrieve and GET /health on a threading stdlib server.

Why the standard library: no extra dependency, and one thread per connection holds a few hundred
keep-alive clients easily because the threads only parse JSON and wait; the retrieval itself runs
in the batcher's single worker, batched. (Measured: benchmarks/results/service_load.md.)
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from drmas_envs.search.retrievers import Passage, Retriever
from drmas_retrieval.batcher import Batcher, Overloaded

logger = logging.getLogger(__name__)


@dataclass
class ServiceConfig:
    """Limits and batching of the service."""

    host: str = "127.0.0.1"
    """Bind address; loopback by default. Use 0.0.0.0 only on a trusted network."""
    port: int = 8000
    """TCP port (0 picks a free one)."""
    max_batch: int = 256
    """The most queries per retriever call."""
    max_body_bytes: int = 1 << 20
    """Larger request bodies get 413."""
    max_queries: int = 512
    """The most queries in one request."""
    max_topk: int = 100
    """The largest topk accepted."""
    max_query_chars: int = 4096
    """The longest query accepted."""
    request_timeout: float = 120.0
    """Seconds a request may wait for its batch before a 503."""
    idle_timeout: float = 60.0
    """Seconds an idle keep-alive connection is kept open."""
    max_pending: int = 50_000
    """Queries waiting beyond this get 503 (the client retries)."""


class BadRequest(ValueError):
    """A client error: answered with `status` and the message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


_DRAIN_LIMIT = 64 << 20  # an oversized body up to this size is read and dropped, so the client sees the 413


def parse_request(body: bytes, cfg: ServiceConfig) -> tuple[list[str], int, bool]:
    """Validate a /retrieve body: (queries, topk, return_scores), or raise `BadRequest`."""
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise BadRequest(400, "body must be a JSON object")
    queries = payload.get("queries", payload.get("query"))
    if isinstance(queries, str):
        queries = [queries]
    if not isinstance(queries, list) or not queries:
        raise BadRequest(400, "give 'queries' (a non-empty list of strings) or 'query' (a string)")
    if len(queries) > cfg.max_queries:
        raise BadRequest(413, f"{len(queries)} queries in one request; the limit is {cfg.max_queries}")
    for q in queries:
        if not isinstance(q, str):
            raise BadRequest(400, "every query must be a string")
        if len(q) > cfg.max_query_chars:
            raise BadRequest(413, f"a query has {len(q)} characters; the limit is {cfg.max_query_chars}")
    topk = payload.get("topk", 3)
    if isinstance(topk, bool) or not isinstance(topk, int) or not 1 <= topk <= cfg.max_topk:
        raise BadRequest(400, f"'topk' must be an integer from 1 to {cfg.max_topk}")
    return_scores = payload.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise BadRequest(400, "'return_scores' must be true or false")
    return queries, topk, return_scores


def to_wire(results: list[list[Passage]], return_scores: bool) -> dict[str, Any]:
    """Search-R1's reply: with scores, [{"document": {...}, "score": s}]; without, the documents."""
    out = []
    for hits in results:
        docs = [{"id": p.id, "contents": p.contents} for p in hits]
        out.append([{"document": d, "score": p.score} for d, p in zip(docs, hits)] if return_scores else docs)
    return {"result": out}


class Handler(BaseHTTPRequestHandler):
    """One connection (HTTP/1.1 keep-alive)."""

    protocol_version = "HTTP/1.1"
    server: RetrievalServer

    def setup(self) -> None:
        self.timeout = self.server.config.idle_timeout
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        logger.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        body = json.dumps(payload).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": message})

    def do_GET(self) -> None:
        if self.path.rstrip("/") != "/health":
            return self._error(404, f"no such path {self.path!r}; use POST /retrieve or GET /health")
        b = self.server.batcher
        self._send(200, {"status": "ok", "pending": b.pending, "batches": b.batches, "queries": b.queries})

    def _read_body(self) -> bytes:
        cfg = self.server.config
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            raise BadRequest(411, "send a Content-Length body, not chunked encoding")
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True
            raise BadRequest(411, "a Content-Length header is required") from None
        if length < 0:
            self.close_connection = True
            raise BadRequest(400, "negative Content-Length")
        if length > cfg.max_body_bytes:
            if length <= _DRAIN_LIMIT:
                self._discard(length)
            else:
                self.close_connection = True
            raise BadRequest(413, f"body of {length} bytes; the limit is {cfg.max_body_bytes}")
        return self.rfile.read(length)

    def _discard(self, length: int) -> None:
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 16))
            if not chunk:
                self.close_connection = True
                return
            length -= len(chunk)

    def do_POST(self) -> None:
        try:
            if self.path.rstrip("/") != "/retrieve":
                self.close_connection = True  # the body was not read
                raise BadRequest(404, f"no such path {self.path!r}; use POST /retrieve")
            queries, topk, return_scores = parse_request(self._read_body(), self.server.config)
            results = self.server.batcher.submit(queries, topk, timeout=self.server.config.request_timeout)
        except BadRequest as exc:
            return self._error(exc.status, str(exc))
        except (Overloaded, TimeoutError) as exc:
            return self._error(503, f"busy, retry later: {exc}")
        except Exception as exc:  # a retriever failure: report it, keep serving
            logger.exception("retrieval failed")
            return self._error(500, f"retrieval failed: {type(exc).__name__}: {exc}")
        self._send(200, to_wire(results, return_scores))


class RetrievalServer(ThreadingHTTPServer):
    """A threading HTTP server with a deep accept backlog and a shared `Batcher`."""

    daemon_threads = True
    request_queue_size = 1024  # the stdlib default of 5 refuses connections when 200 clients connect at once
    allow_reuse_address = True

    def __init__(self, retriever: Retriever, config: ServiceConfig | None = None):
        self.config = config or ServiceConfig()
        self.batcher = Batcher(retriever, max_batch=self.config.max_batch, max_pending=self.config.max_pending)
        super().__init__((self.config.host, self.config.port), Handler)

    @property
    def url(self) -> str:
        """The base URL clients use."""
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (timed out, closed) is routine: log it, no traceback on stderr."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            logger.info("client %s went away: %s", client_address, exc)
        else:
            logger.exception("error while serving %s", client_address)

    def server_close(self) -> None:
        super().server_close()
        self.batcher.close()


def serve_in_thread(
    retriever: Retriever, config: ServiceConfig | None = None
) -> tuple[RetrievalServer, threading.Thread]:
    """Start a server in a daemon thread (for tests and notebooks); stop it with `server.shutdown()`."""
    server = RetrievalServer(retriever, config)
    thread = threading.Thread(target=server.serve_forever, name="retrieval-server", daemon=True)
    thread.start()
    return server, thread
