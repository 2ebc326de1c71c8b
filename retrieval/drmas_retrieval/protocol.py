"""The service's protocol, shared by both front ends (stdlib and ASGI): config, routes, validation, replies.

Everything that decides a status code or a reply body lives here; the servers only move bytes. So
the two front ends cannot drift: the same request gets the same status and message from either.
`ServiceConfig` lives in drmas_retrieval.config and is re-exported here.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from drmas_envs.search.retrievers import Passage
from drmas_retrieval.batcher import Batcher, Overloaded, ReplyTooLarge
from drmas_retrieval.config import ServiceConfig

logger = logging.getLogger(__name__)

SERVERS = ("stdlib", "asgi")
"""The front ends `--server` accepts."""

DRAIN_LIMIT = 64 << 20
"""An oversized body up to this size is read and dropped, so the client sees the 413 (not a reset)."""


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


def body_length(transfer_encodings: list[str], content_lengths: list[str]) -> int:
    """Check a /retrieve request's framing headers (every value of each) and return its body length.

    Raises `BadRequest`: 400 for ambiguous framing (a Transfer-Encoding beside a Content-Length, or
    Content-Lengths that disagree) or a malformed length, 411 for chunked or missing framing.
    """
    if transfer_encodings and content_lengths:
        raise BadRequest(400, "ambiguous framing: both Transfer-Encoding and Content-Length", close=True)
    if transfer_encodings:
        raise BadRequest(411, "send a Content-Length body, not chunked encoding", close=True)
    if not content_lengths:
        raise BadRequest(411, "a Content-Length header is required", close=True)
    values = {v.strip() for line in content_lengths for v in line.split(",")}
    if len(values) != 1:
        raise BadRequest(400, "ambiguous framing: Content-Length values disagree", close=True)
    value = values.pop()
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise BadRequest(400, f"malformed Content-Length {value[:40]!r}", close=True)
    return int(value)


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
        payload = json.loads(body, parse_int=_small_int, parse_constant=_no_constant)
    except RecursionError:
        raise BadRequest(400, "body is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, and the two hooks' refusals
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
    chars = sum(map(len, queries))
    if chars > cfg.max_request_chars:
        raise BadRequest(413, f"{chars} query characters in one request; the limit is {cfg.max_request_chars}")
    if len(queries) * topk > cfg.max_hits:
        raise BadRequest(413, f"{len(queries)} queries x topk {topk} hits; the limit is {cfg.max_hits}")
    return queries, topk, return_scores


def _small_int(text: str) -> int:
    if len(text.lstrip("-")) > 18:
        raise ValueError(f"an integer of {len(text)} characters")
    return int(text)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _wire_hits(hits: list[Passage], return_scores: bool) -> list[Any]:
    docs = [{"id": p.id, "contents": p.contents} for p in hits]
    return [{"document": d, "score": p.score} for d, p in zip(docs, hits)] if return_scores else docs


def encode_hits(hits: list[Passage], return_scores: bool) -> bytes:
    """One query's part of the reply, as UTF-8 JSON bytes (`reply_parts` joins them)."""
    return json.dumps(_wire_hits(hits, return_scores)).encode("utf-8")


REPLY_HEAD, REPLY_SEP, REPLY_TAIL = b'{"result": [', b", ", b"]}"


def reply_parts(pieces: list[bytes]) -> list[bytes]:
    """The reply body as parts to write in turn: the same bytes as `encode(to_wire(...))`."""
    parts = [REPLY_HEAD]
    for i, piece in enumerate(pieces):
        parts += [REPLY_SEP, piece] if i else [piece]
    return [*parts, REPLY_TAIL]


def to_wire(results: list[list[Passage]], return_scores: bool) -> dict[str, Any]:
    """Search-R1's reply: with scores, [{"document": {...}, "score": s}]; without, the documents."""
    return {"result": [_wire_hits(hits, return_scores) for hits in results]}


def health(batcher: Batcher, **extra: Any) -> dict[str, Any]:
    """The GET /health reply (`extra`: a front end's own gauges, such as open connections)."""
    out = {"status": "ok", "pending": batcher.pending, "batches": batcher.batches, "queries": batcher.queries}
    return out | extra


def error(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The status and body for an exception raised while answering a request; logs a retriever failure."""
    if isinstance(exc, BadRequest):
        return exc.status, {"error": str(exc)}
    if isinstance(exc, ReplyTooLarge):
        return 413, {"error": str(exc)}
    if isinstance(exc, (Overloaded, TimeoutError)):
        return 503, {"error": f"busy, retry later: {exc}"}
    logger.error("retrieval failed", exc_info=exc)
    return 500, {"error": f"retrieval failed: {type(exc).__name__}: {exc}"}


def encode(payload: dict[str, Any]) -> bytes:
    """A reply body as UTF-8 JSON bytes."""
    return json.dumps(payload).encode("utf-8")
