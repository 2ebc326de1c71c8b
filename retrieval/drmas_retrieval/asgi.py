"""The ASGI front end (`--server asgi`, extra `drmas-retrieval[asgi]`): the same protocol on starlette + uvicorn.

What Search-R1's own retrieval server runs on (FastAPI is starlette underneath), for users who deploy
ASGI apps behind their own tooling: `create_app(batcher, config)` is a plain ASGI app. Statuses,
messages, request caps and fair batching are those of the stdlib server: both call
drmas_retrieval.protocol and share one `Batcher`, whose `asubmit` waits on the event loop without
holding a thread per request. Connections are capped (uvicorn's `limit_concurrency`, 503 beyond),
but uvicorn has no deadline for a request's headers or for writing a reply, so this front end does
not hold the stdlib one's memory bound against slow or non-reading clients (docs/retrieval.md).
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from drmas_envs.search.retrievers import Retriever
from drmas_retrieval import protocol
from drmas_retrieval.batcher import Batcher
from drmas_retrieval.protocol import BadRequest, ServiceConfig

logger = logging.getLogger(__name__)

_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]


def _json(status: int, payload: dict[str, Any], close: bool = False) -> Response:
    headers = {"Connection": "close"} if close else None
    return Response(protocol.encode(payload), status, headers=headers, media_type="application/json")


async def _read_body(request: Request, cfg: ServiceConfig) -> bytes:
    headers = request.headers
    length = protocol.body_length(headers.getlist("transfer-encoding"), headers.getlist("content-length"))
    oversized = protocol.too_large(length, cfg)
    if oversized is not None:
        # not read here: uvicorn discards the rest of a body once the reply is sent, keeping the connection
        # (tested: a 2 MB and a 10 MB body get the 413 on a connection that then serves the next request)
        raise oversized
    return await request.body()


def create_app(batcher: Batcher, config: ServiceConfig | None = None) -> Starlette:
    """The ASGI app: POST /retrieve and GET /health over `batcher`; every other request gets a JSON 4xx."""
    cfg = config or ServiceConfig()

    async def endpoint(request: Request) -> Response:
        try:
            if protocol.route(request.method, request.url.path) == "health":
                return _json(200, protocol.health(batcher))
            queries, topk, return_scores = protocol.parse_request(await _read_body(request, cfg), cfg)
            client = request.client.host if cfg.client_key == "ip" and request.client else request.client
            encode = functools.partial(protocol.encode_hits, return_scores=return_scores)
            pieces = await batcher.asubmit(queries, topk, timeout=cfg.request_timeout, client=client,
                                           encode=encode, max_bytes=cfg.max_reply_bytes)  # fmt: skip
        except Exception as exc:  # a client error, an overload, or a retriever failure: answer it, keep serving
            return _json(*protocol.error(exc), close=isinstance(exc, BadRequest) and exc.close)
        body = b"".join(protocol.reply_parts(pieces))
        if batcher.budget is not None:
            batcher.budget.release(sum(map(len, pieces)))
        return Response(body, 200, media_type="application/json")

    # one catch-all route: the routing decision is protocol.route's, the same as the stdlib server's
    return Starlette(routes=[Route("/{path:path}", endpoint, methods=_METHODS)])


class AsgiRetrievalServer:
    """uvicorn serving `create_app` on a socket bound at construction, with the stdlib server's interface.

    `url`, `server_address`, `batcher`, `serve_forever()` (blocks), `shutdown()` (from another thread;
    returns once serving stopped) and `server_close()`, so tests and the CLI treat both servers alike.
    """

    def __init__(self, retriever: Retriever, config: ServiceConfig | None = None):
        self.config = cfg = config or ServiceConfig()
        self.batcher = Batcher.from_config(retriever, cfg)
        family = socket.AF_INET6 if ":" in cfg.host else socket.AF_INET
        # bound here, not by uvicorn, so that port 0 resolves and the URL is known before serving starts
        self.socket = socket.create_server((cfg.host, cfg.port), family=family, backlog=cfg.backlog)
        self.server_address = self.socket.getsockname()
        uv_config = uvicorn.Config(
            create_app(self.batcher, cfg),
            backlog=cfg.backlog,
            timeout_keep_alive=max(1, round(cfg.idle_timeout)),
            limit_concurrency=cfg.max_connections,  # uvicorn answers 503 beyond it
            h11_max_incomplete_event_size=cfg.max_header_bytes,
            timeout_graceful_shutdown=5,
            lifespan="off",
            access_log=False,
            log_config=None,  # keep the caller's logging setup (uvicorn's default replaces handlers)
        )
        self._uvicorn = uvicorn.Server(uv_config)
        self._serving = threading.Event()
        self._stopped = threading.Event()

    @property
    def url(self) -> str:
        """The base URL clients use."""
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def serve_forever(self) -> None:
        """Serve until `shutdown()` (or, in the main thread, SIGINT/SIGTERM, which uvicorn re-raises)."""
        self._serving.set()
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop `serve_forever` (running in another thread) and wait for it to return."""
        self._uvicorn.should_exit = True
        if self._serving.is_set():
            self._stopped.wait()

    def server_close(self) -> None:
        """Release the socket and stop the batcher."""
        self.socket.close()
        self.batcher.close()
