"""Socket I/O with whole-phase deadlines, and the byte budget all connections share.

A socket timeout alone restarts with every byte received, so a client dribbling one byte a second
holds a connection forever. `DeadlineReader` instead sets each read's timeout to what is left of the
phase's deadline (waiting for a request, its headers, its body), and `DeadlineWriter` gives a whole
reply one deadline, so a client that stops reading is dropped and the reply freed.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time

from drmas_retrieval.config import READ_CHUNK


class HeaderTooLarge(http.client.LineTooLong):
    """The request line and headers exceed their byte cap (answered 431)."""

    def __init__(self, limit: int):
        http.client.HTTPException.__init__(self, f"request line and headers over {limit} bytes")


class ByteBudget:
    """Bytes that all connections together may hold; a reservation beyond it is refused, never waited for."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def try_reserve(self, n: int) -> bool:
        """Reserve `n` bytes if they fit under the limit."""
        with self._lock:
            if self.held + n > self.limit:
                return False
            self.held += n
            return True

    def release(self, n: int) -> None:
        """Give back `n` reserved bytes."""
        with self._lock:
            self.held -= n


class DeadlineReader:
    """A file-like reader (`readline`, `read`) over a socket whose reads share one deadline per phase."""

    def __init__(self, sock: socket.socket):
        self._sock = sock
        self._buf = bytearray()
        self._deadline = time.monotonic()
        self._then: float | None = None
        self._header_limit: int | None = None
        self._header_bytes = 0

    def expect_request(self, idle: float, header_timeout: float, max_header_bytes: int) -> None:
        """Wait up to `idle` s for a request's first byte; from it, `header_timeout` s for all its headers."""
        if self._buf:  # a pipelined request is already here: its header deadline starts now
            idle, header_timeout = header_timeout, None
        self._deadline = time.monotonic() + idle
        self._then = header_timeout
        self._header_limit = max_header_bytes
        self._header_bytes = 0

    def expect_body(self, timeout: float) -> None:
        """The body must arrive within `timeout` s from now."""
        self._deadline = time.monotonic() + timeout
        self._then = None
        self._header_limit = None

    def _fill(self) -> bool:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("deadline passed")
        self._sock.settimeout(remaining)
        data = self._sock.recv(READ_CHUNK)
        if data and self._then is not None:
            self._deadline = time.monotonic() + self._then
            self._then = None
        self._buf += data
        return bool(data)

    def _take(self, n: int) -> bytes | bytearray:
        if n == len(self._buf):  # the common case: hand over the buffer, no copy
            out, self._buf = self._buf, bytearray()
        else:
            out = bytes(self._buf[:n])
            del self._buf[:n]
        if self._header_limit is not None:
            self._header_bytes += len(out)
            if self._header_bytes > self._header_limit:
                raise HeaderTooLarge(self._header_limit)
        return out

    def readline(self, limit: int = -1) -> bytes | bytearray:
        """One line (with its newline), at most `limit` bytes; short at end of stream."""
        cap = self._header_limit + 1 if self._header_limit is not None else None
        while True:
            end = self._buf.find(b"\n") + 1
            full = end or len(self._buf)
            if end or (0 <= limit <= full) or (cap is not None and self._header_bytes + full > cap):
                break
            if not self._fill():
                break
        n = end or len(self._buf)
        return self._take(n if limit < 0 else min(n, limit))

    def read(self, n: int) -> bytes | bytearray:
        """`n` bytes, or fewer at end of stream."""
        while len(self._buf) < n and self._fill():
            pass
        return self._take(min(n, len(self._buf)))

    def close(self) -> None:
        """Drop what is buffered (the socket is the server's to close)."""
        self._buf = bytearray()


class DeadlineWriter:
    """A file-like writer over a socket: every write of one reply shares the deadline set by `start`."""

    closed = False

    def __init__(self, sock: socket.socket, timeout: float):
        self._sock = sock
        self._timeout = timeout
        self._deadline: float | None = None

    def start(self) -> None:
        """A new reply: its writes must all finish within the write timeout from now."""
        self._deadline = time.monotonic() + self._timeout

    def end(self) -> None:
        """The reply is written; the next write starts a new deadline."""
        self._deadline = None

    def write(self, data: bytes) -> int:
        """Send all of `data` before the deadline, or raise TimeoutError."""
        if self._deadline is None:
            self.start()
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("write deadline passed")
        self._sock.settimeout(remaining)
        self._sock.sendall(data)  # the timeout bounds the whole call (Python >= 3.5)
        return len(data)

    def flush(self) -> None:
        """Nothing is buffered."""

    def close(self) -> None:
        """The socket is the server's to close."""
