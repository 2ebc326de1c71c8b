"""The service's limits: one typed field per bound, each with the help text its CLI flag shows.

Every resource a client can make the service hold has a cap here, and `memory_bound` adds them up:
the figure the server logs at start is computed from these fields, not measured.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

CLIENT_KEYS = ("connection", "ip")
"""What `client_key` may name: the unit of fair scheduling and of the per-client queue cap."""

HANDLER_STACK_BYTES = 512 << 10
"""Stack reserved for each connection's thread (JSON nesting is cut off by the recursion limit well within it)."""

READ_CHUNK = 64 << 10
"""The most bytes one socket read asks for."""

JSON_EXPANSION = 32
"""Worst objects-per-byte growth of `json.loads`: `[{},{},...]` makes a 64-byte dict plus an 8-byte list
slot per 3 input bytes (24x); rounded up. Parses run one at a time, so one body's worth is counted."""

BODY_FACTOR = 4
"""A parsed query can take 4 bytes per character (a str holding one astral character stores all its
characters that wide), so a body reserves 4x its length from the shared buffer budget."""

PASSAGE_FACTOR = 4
"""Bytes per stored byte of a passage held as a str (4 when it holds one astral character)."""

ESCAPE_FACTOR = 6
"""Bytes per stored byte of a passage JSON-encoded with ASCII escapes (one query's hits at a time)."""


def _f(default: Any, help: str) -> Any:  # noqa: A002 - argparse's word
    return field(default=default, metadata={"help": help})


@dataclass
class ServiceConfig:
    """Limits, deadlines and batching of the service (each field is a `drmas-retrieval serve` flag)."""

    host: str = _f("127.0.0.1", "bind address; loopback by default, 0.0.0.0 only on a trusted network")
    port: int = _f(8000, "TCP port (0 picks a free one)")
    max_connections: int = _f(256, "open connections served at once (one thread each); more get 503 at once")
    idle_timeout: float = _f(60.0, "seconds a keep-alive connection may wait for its next request's first byte")
    header_timeout: float = _f(10.0, "seconds from a request's first byte to the end of its headers, in total")
    body_timeout: float = _f(30.0, "seconds from the end of the headers to the end of the body, in total")
    write_timeout: float = _f(30.0, "seconds to write a whole reply; a client that does not read is dropped")
    send_buffer_bytes: int = _f(512 << 10, "kernel send buffer per connection (SO_SNDBUF): what a client that "
                                           "does not read can park outside the write deadline")  # fmt: skip
    request_timeout: float = _f(120.0, "seconds a request may wait for retrieval; then 503 and its queued work "
                                       "is cancelled")  # fmt: skip
    max_header_bytes: int = _f(16 << 10, "bytes of request line plus headers; more get 431")
    max_body_bytes: int = _f(1 << 20, "bytes of request body; more get 413")
    max_reply_bytes: int = _f(16 << 20, "bytes of one reply; a request whose hits would exceed it gets 413")
    buffer_bytes: int = _f(256 << 20, "bytes of request bodies and replies held at once, all clients "
                                      "together; a request that would exceed it gets 503")  # fmt: skip
    max_queries: int = _f(512, "queries in one request; more get 413")
    max_query_chars: int = _f(4096, "characters of one query; longer get 413")
    max_request_chars: int = _f(256 << 10, "characters of all queries of one request; more get 413")
    max_topk: int = _f(100, "largest topk accepted")
    max_hits: int = _f(5120, "queries x topk of one request; more get 413")
    max_batch: int = _f(256, "queries per retriever call")
    max_batch_chars: int = _f(4 << 10, "query characters per retriever call, which bounds how long one call "
                                       "holds the line; a heavy request is split across calls, interleaved "
                                       "fairly with other clients")  # fmt: skip
    max_batch_hits: int = _f(1024, "queries x k per retriever call (with max_batch_chars, how long a call "
                                   "holds the line)")  # fmt: skip
    max_pending: int = _f(50_000, "queries queued, all clients together; beyond it 503")
    max_pending_per_client: int = _f(2048, "queries queued by one client; beyond it 503")
    client_key: str = _f("connection", "what a client is for fair scheduling and its queue cap: connection "
                                       "(works behind proxies and on loopback) or ip")  # fmt: skip
    backlog: int = _f(1024, "TCP accept backlog (the stdlib's default of 5 refuses bursts of connections)")

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name not in ("host", "port", "client_key") and not value > 0:
                raise ValueError(f"{f.name} must be positive, got {value!r}")
        if self.client_key not in CLIENT_KEYS:
            raise ValueError(f"client_key must be one of {', '.join(CLIENT_KEYS)}, got {self.client_key!r}")
        if self.max_batch_chars < self.max_query_chars:
            raise ValueError("max_batch_chars must be at least max_query_chars (one query fits a call)")
        if min(self.max_hits, self.max_batch_hits) < self.max_topk:
            raise ValueError("max_hits and max_batch_hits must be at least max_topk (one query fits a call)")


@dataclass
class MemoryBound:
    """The most memory the service holds, in bytes, and what it is made of."""

    base: int
    """Resident before serving (the index, the interpreter)."""
    connections: int
    """Threads and header buffers of `max_connections` connections."""
    buffers: int
    """Request bodies (reserved at BODY_FACTOR x their length) and encoded replies: the shared budget."""
    parse: int
    """One body being parsed."""
    batch: int
    """The passages of one retriever call, when the longest passage is known."""
    kernel: int = 0
    """Kernel send buffers of all connections (outside the process; Linux doubles what is asked)."""

    @property
    def total(self) -> int:
        """The bound."""
        return self.base + self.connections + self.buffers + self.parse + self.batch

    def line(self) -> str:
        """The log line stating it."""
        mib = lambda n: f"{n / (1 << 20):.0f} MiB"  # noqa: E731
        return (
            f"memory bound {mib(self.total)}: resident at start {mib(self.base)} + connections "
            f"{mib(self.connections)} + bodies and replies {mib(self.buffers)} + one parse {mib(self.parse)} "
            f"+ one batch's passages {mib(self.batch)}; and up to {mib(self.kernel)} in kernel send buffers"
        )


def memory_bound(cfg: ServiceConfig, base: int, longest_passage: int | None = None) -> MemoryBound:
    """Add up what `cfg` lets clients make the service hold on top of `base` resident bytes.

    `longest_passage` (bytes) bounds one retriever call's results; None leaves that term at 0.
    """
    per_connection = HANDLER_STACK_BYTES + 2 * cfg.max_header_bytes + READ_CHUNK
    per_passage = PASSAGE_FACTOR * cfg.max_batch_hits + ESCAPE_FACTOR * cfg.max_topk
    batch = 0 if longest_passage is None else per_passage * longest_passage
    return MemoryBound(
        base=base,
        connections=cfg.max_connections * per_connection,
        buffers=cfg.buffer_bytes,
        parse=JSON_EXPANSION * cfg.max_body_bytes,
        batch=batch,
        kernel=2 * cfg.max_connections * cfg.send_buffer_bytes,
    )


def resident_bytes() -> int:
    """Resident memory of this process now (Linux /proc; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def longest_passage(retriever: Any) -> int | None:
    """The longest stored passage in bytes, when the retriever keeps an on-disk store with offsets."""
    offsets = getattr(getattr(retriever, "store", None), "_offsets", None)
    if offsets is None or len(offsets) < 2:
        return None
    return int(np.diff(offsets).max())
