"""The service's protocol, shared by both front ends (stdlib and ASGI): config, routes, validation, replies.

Everything that decides a status code or a reply body lives here; the servers only move bytes. So
the two front ends cannot drift: the same request gets the same status and message from either.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from drmas_envs.search.retrievers import Passage
from drmas_retrieval.batcher import Batcher, Overloaded

logger = logging.getLogger(__name__)

SERVERS = ("stdlib", "asgi")
"""The front ends `--server` accepts."""

DRAIN_LIMIT = 64 << 20
"""An oversized body up to this size is read and dropped, so the client sees the 413 (not a reset)."""


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
    backlog: int = 1024
    """TCP accept backlog; small backlogs (the stdlib's default is 5) refuse connections when 200 clients
    connect at once."""


class BadRequest(ValueError):
    """A client error: answered with `status` and the message; `close` drops the connection afterwards."""

    def __init__(self, status: int, message: str, *, close: bool = False):
        super().__init__(message)
        self.status = status
        self.close = close


def route(method: str, path: str) -> str:
    """Name the endpoint of a request ("retrieve" or "health"), or raise `BadRequest` (404/405)."""
    path = path.split("?", 1)[0].rstrip("/")
    if method == "POST" and path == "/retrieve":
        return "retrieve"
    if method == "GET" and path == "/health":
        return "health"
    if method in ("GET", "POST"):
        # a POST body was not read, so the connection cannot carry another request
        message = f"no such path {path or '/'!r}; use POST /retrieve or GET /health"
        raise BadRequest(404, message, close=method == "POST")
    raise BadRequest(405, f"method {method} not allowed; use POST /retrieve or GET /health", close=True)


def body_length(transfer_encoding: str | None, content_length: str | None) -> int:
    """Check a /retrieve request's framing headers and return its body length, or raise `BadRequest`."""
    if (transfer_encoding or "").lower() == "chunked":
        raise BadRequest(411, "send a Content-Length body, not chunked encoding", close=True)
    try:
        length = int(content_length or "")
    except ValueError:
        raise BadRequest(411, "a Content-Length header is required", close=True) from None
    if length < 0:
        raise BadRequest(400, "negative Content-Length", close=True)
    return length


def too_large(length: int, cfg: ServiceConfig) -> BadRequest | None:
    """The 413 for a body of `length` bytes, or None when it fits.

    Its `close` is set only when the body is too large to drain (over `DRAIN_LIMIT`); the caller reads
    and drops a smaller one before answering, so the connection stays usable.
    """
    if length <= cfg.max_body_bytes:
        return None
    return BadRequest(413, f"body of {length} bytes; the limit is {cfg.max_body_bytes}", close=length > DRAIN_LIMIT)


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


def health(batcher: Batcher) -> dict[str, Any]:
    """The GET /health reply."""
    return {"status": "ok", "pending": batcher.pending, "batches": batcher.batches, "queries": batcher.queries}


def error(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The status and body for an exception raised while answering a request; logs a retriever failure."""
    if isinstance(exc, BadRequest):
        return exc.status, {"error": str(exc)}
    if isinstance(exc, (Overloaded, TimeoutError)):
        return 503, {"error": f"busy, retry later: {exc}"}
    logger.error("retrieval failed", exc_info=exc)
    return 500, {"error": f"retrieval failed: {type(exc).__name__}: {exc}"}


def encode(payload: dict[str, Any]) -> bytes:
    """A reply body as UTF-8 JSON bytes."""
    return json.dumps(payload).encode("utf-8")
