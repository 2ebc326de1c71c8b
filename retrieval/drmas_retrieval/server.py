"""The stdlib front end (the default): Search-R1's POST /retrieve and GET /health, with stated bounds.

One thread per connection, at most `max_connections` of them (more get 503 at once). Each phase of
a request has one deadline that bytes do not extend: the wait for the next request, its headers,
its body, and the writing of its reply, so slow or stalled clients are dropped and what they held
is freed. Request bodies and encoded replies draw on one shared byte budget; the queue is capped in
total and per client, and the batcher shares retriever calls fairly. `memory_bound` adds these caps
to what is resident at start, and the server logs that figure. Why this and not the ASGI front end
is the default: docs/retrieval.md.
"""

from __future__ import annotations

import functools
import logging
import select
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from drmas_envs.search.retrievers import Retriever
from drmas_retrieval import protocol
from drmas_retrieval.batcher import Batcher, ClientGone
from drmas_retrieval.config import (
    BODY_FACTOR,
    HANDLER_STACK_BYTES,
    MemoryBound,
    ServiceConfig,
    longest_passage,
    memory_bound,
    resident_bytes,
)
from drmas_retrieval.limits import ByteBudget, DeadlineReader, DeadlineWriter, HeaderTooLarge
from drmas_retrieval.protocol import BadRequest

logger = logging.getLogger(__name__)

_REFUSED = protocol.encode({"error": "busy, retry later: too many open connections"})
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_REFUSED), _REFUSED)
)
"""What a connection over the cap is sent before it is closed."""


class _Dropped(ConnectionError):
    """The connection is closed without a reply (a missed body deadline, a client gone mid-body)."""


class Handler(BaseHTTPRequestHandler):
    """One connection (HTTP/1.1 keep-alive), read and written under deadlines."""

    protocol_version = "HTTP/1.1"
    server: RetrievalServer

    def setup(self) -> None:
        self.connection = self.request
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.server.config.send_buffer_bytes)
        self.rfile = DeadlineReader(self.connection)
        self.wfile = DeadlineWriter(self.connection, self.server.config.write_timeout)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        logger.debug("%s " + format, self.address_string(), *args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        self.wfile.start()  # the stdlib's own errors (malformed request line, 431) get a reply deadline too
        super().send_error(code, message, explain)
        self.wfile.end()

    def handle_expect_100(self) -> bool:
        self.wfile.start()
        try:
            return super().handle_expect_100()
        finally:
            self.wfile.end()

    def handle_one_request(self) -> None:
        cfg = self.server.config
        self.rfile.expect_request(cfg.idle_timeout, cfg.header_timeout, cfg.max_header_bytes)
        try:
            self.raw_requestline = self.rfile.readline(cfg.max_header_bytes + 1)
            if not self.raw_requestline:
                self.close_connection = True
                return
            if not self.parse_request():  # reads the headers; on a bad request it has answered
                return
        except HeaderTooLarge as exc:
            self.close_connection = True
            return self.send_error(431, str(exc))
        except TimeoutError:  # idle too long, or headers too slow: drop the connection
            self.close_connection = True
            self.server.count_drop()
            return
        self.rfile.expect_body(cfg.body_timeout)
        self._handle()

    def _send(self, status: int, payload: dict[str, Any] | None = None, parts: list[bytes] | None = None) -> None:
        parts = parts if parts is not None else [protocol.encode(payload)]
        self.wfile.start()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(sum(map(len, parts))))
        if status == 503:
            self.send_header("Retry-After", "1")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        for part in parts:
            self.wfile.write(part)
        self.wfile.end()

    def _read_body(self) -> tuple[bytes | bytearray, int]:
        """The body and the bytes it reserved from the budget (the caller releases them)."""
        length = protocol.body_length(self.headers.get_all("Transfer-Encoding", []),
                                      self.headers.get_all("Content-Length", []))  # fmt: skip
        oversized = protocol.too_large(length, self.server.config)
        if oversized is not None:
            if not oversized.close:
                self._discard(length)
            raise oversized
        reserve = BODY_FACTOR * length
        if not self.server.budget.try_reserve(reserve):
            raise BadRequest(503, "busy, retry later: the service holds too many request bodies", close=True)
        try:
            body = self.rfile.read(length)
        except BaseException:
            self.server.budget.release(reserve)
            raise
        if len(body) < length:
            self.server.budget.release(reserve)
            raise ConnectionResetError("the client closed the connection mid-body")
        return body, reserve

    def _alive(self) -> bool:
        """Whether the client is still connected (a closed socket reads as end of stream)."""
        try:  # select first: a socket with a timeout waits for data before a non-blocking recv
            if not select.select([self.connection], [], [], 0)[0]:
                return True
            return self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    def _discard(self, length: int) -> None:
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 16))
            if not chunk:
                self.close_connection = True
                return
            length -= len(chunk)

    def _handle(self) -> None:
        srv, cfg = self.server, self.server.config
        reserved = 0
        try:
            if protocol.route(self.command, self.path) == "health":
                return self._send(200, srv.health())
            try:
                body, reserved = self._read_body()
            except (TimeoutError, ConnectionError) as exc:  # body too slow, or the client left
                raise _Dropped(str(exc)) from exc
            with srv.parse_lock:  # one parse at a time: the memory bound counts one body's objects
                queries, topk, return_scores = protocol.parse_request(body, cfg)
            del body
            encode = functools.partial(protocol.encode_hits, return_scores=return_scores)
            pieces = srv.batcher.submit(queries, topk, timeout=cfg.request_timeout, client=srv.client_key(self),
                                        encode=encode, max_bytes=cfg.max_reply_bytes, alive=self._alive)  # fmt: skip
        except (_Dropped, ClientGone):  # a body too slow, a client gone mid-body or while its queries waited
            srv.budget.release(reserved)
            self.close_connection = True
            raise
        except Exception as exc:  # a client error, an overload, or a retriever failure: answer it, keep serving
            srv.budget.release(reserved)
            if isinstance(exc, BadRequest) and exc.close:
                self.close_connection = True
            return self._send(*protocol.error(exc))
        srv.budget.release(reserved)
        held = sum(map(len, pieces))
        try:
            self._send(200, parts=protocol.reply_parts(pieces))
        finally:
            del pieces
            srv.budget.release(held)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle


class RetrievalServer(ThreadingHTTPServer):
    """A threading HTTP server with a connection cap, a shared byte budget and a fair `Batcher`."""

    daemon_threads = True
    block_on_close = False  # closing does not wait out the deadlines of connections still open
    allow_reuse_address = True

    def __init__(self, retriever: Retriever, config: ServiceConfig | None = None):
        self.config = cfg = config or ServiceConfig()
        self.request_queue_size = cfg.backlog
        self.budget = ByteBudget(cfg.buffer_bytes)
        self.parse_lock = threading.Lock()
        self.batcher = Batcher.from_config(retriever, cfg, budget=self.budget)
        self.connections = self.refused = self.deadline_drops = 0
        self._count_lock = threading.Lock()
        super().__init__((cfg.host, cfg.port), Handler)
        self.bound: MemoryBound = memory_bound(cfg, resident_bytes(), longest_passage(retriever))
        logger.info("%s", self.bound.line())

    @property
    def url(self) -> str:
        """The base URL clients use."""
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def client_key(self, handler: Handler) -> Any:
        """Whose fair share a request draws on: its connection, or its IP address."""
        address = handler.client_address
        return address[0] if self.config.client_key == "ip" else tuple(address[:2])

    def health(self) -> dict[str, Any]:
        """The GET /health reply, with this front end's gauges."""
        gauges = {"connections": self.connections, "refused": self.refused, "deadline_drops": self.deadline_drops}
        return protocol.health(self.batcher, **gauges, buffered_bytes=self.budget.held,
                               memory_bound_bytes=self.bound.total)  # fmt: skip

    def count_drop(self) -> None:
        """One more connection dropped for missing a deadline."""
        with self._count_lock:
            self.deadline_drops += 1

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection in a new thread, or answer 503 and close it when the cap is reached."""
        with self._count_lock:
            full = self.connections >= self.config.max_connections
            self.refused += full
            self.connections += not full
        if full:
            return self._refuse(request)
        previous = threading.stack_size(HANDLER_STACK_BYTES)
        try:
            super().process_request(request, client_address)
        except RuntimeError:  # no thread could be started
            with self._count_lock:
                self.connections -= 1
            self._refuse(request)
        finally:
            threading.stack_size(previous)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._count_lock:
                self.connections -= 1

    def _refuse(self, request: socket.socket) -> None:
        try:
            request.setblocking(False)
            request.send(REFUSAL)
        except OSError:
            pass
        self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away or missed a deadline is routine: log it, no traceback on stderr."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            if isinstance(exc, TimeoutError) or isinstance(exc.__cause__, TimeoutError):
                self.count_drop()
            logger.debug("client %s dropped: %s", client_address, exc)
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
