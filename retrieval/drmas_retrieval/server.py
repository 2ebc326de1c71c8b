"""The stdlib front end (the default): Search-R1's POST /retrieve and GET /health on a threading server.

Why the standard library: no extra dependency, and one thread per connection holds a few hundred
keep-alive clients easily because the threads only parse JSON and wait; the retrieval itself runs
in the batcher's single worker, batched. `--server asgi` serves the same protocol on uvicorn
(drmas_retrieval.asgi). Measured against each other: benchmarks/results/service_load.md.
"""

from __future__ import annotations

import logging
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from drmas_envs.search.retrievers import Retriever
from drmas_retrieval import protocol
from drmas_retrieval.batcher import Batcher
from drmas_retrieval.protocol import BadRequest, ServiceConfig

logger = logging.getLogger(__name__)


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
        body = protocol.encode(payload)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _read_body(self) -> bytes:
        length = protocol.body_length(self.headers.get("Transfer-Encoding"), self.headers.get("Content-Length"))
        oversized = protocol.too_large(length, self.server.config)
        if oversized is not None:
            if not oversized.close:
                self._discard(length)
            raise oversized
        return self.rfile.read(length)

    def _discard(self, length: int) -> None:
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 16))
            if not chunk:
                self.close_connection = True
                return
            length -= len(chunk)

    def _handle(self) -> None:
        try:
            if protocol.route(self.command, self.path) == "health":
                return self._send(200, protocol.health(self.server.batcher))
            queries, topk, return_scores = protocol.parse_request(self._read_body(), self.server.config)
            results = self.server.batcher.submit(queries, topk, timeout=self.server.config.request_timeout)
        except Exception as exc:  # a client error, an overload, or a retriever failure: answer it, keep serving
            if isinstance(exc, BadRequest) and exc.close:
                self.close_connection = True
            return self._send(*protocol.error(exc))
        self._send(200, protocol.to_wire(results, return_scores))

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle


class RetrievalServer(ThreadingHTTPServer):
    """A threading HTTP server with a deep accept backlog and a shared `Batcher`."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, retriever: Retriever, config: ServiceConfig | None = None):
        self.config = config or ServiceConfig()
        self.request_queue_size = self.config.backlog
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


def make_server(retriever: Retriever, config: ServiceConfig | None = None, server: str = "stdlib") -> Any:
    """A bound, not yet serving, front end: `RetrievalServer` ("stdlib") or `AsgiRetrievalServer` ("asgi").

    Both have `url`, `server_address`, `batcher`, `serve_forever()`, `shutdown()` and `server_close()`.

    Raises:
        ValueError: an unknown `server`.
        ModuleNotFoundError: "asgi" without the `drmas-retrieval[asgi]` extra installed.

    """
    if server == "stdlib":
        return RetrievalServer(retriever, config)
    if server == "asgi":
        from drmas_retrieval.asgi import AsgiRetrievalServer  # optional extra: imported only when asked for

        return AsgiRetrievalServer(retriever, config)
    raise ValueError(f"unknown server {server!r}; choose one of {', '.join(protocol.SERVERS)}")


def serve_in_thread(
    retriever: Retriever, config: ServiceConfig | None = None, server: str = "stdlib"
) -> tuple[Any, threading.Thread]:
    """Start a server in a daemon thread (for tests and notebooks); stop it with `server.shutdown()`."""
    srv = make_server(retriever, config, server)
    thread = threading.Thread(target=srv.serve_forever, name=f"retrieval-{server}", daemon=True)
    thread.start()
    return srv, thread
