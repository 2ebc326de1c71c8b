"""Fair dynamic batching: queries from many clients share retriever calls, and no client holds the line.

Handlers submit jobs (threads through `submit`, asyncio tasks through `asubmit`). Each query gets
virtual start and finish tags on its client's clock (start-time fair queueing): a client's next query
starts where its previous one finished, or at the virtual time now being served if it has been idle,
and finishes its cost later: its share of a call, its characters plus its k hits at
`max_batch_chars / max_batch_hits` characters each. One worker thread builds each retriever call
from the queries with the smallest start tags (the cheaper first among equal starts), up to
`max_batch` queries, `max_batch_chars` characters and `max_batch_hits` hits, so a heavy request is
split across calls and interleaved with everyone else's: a short request that arrives behind it
goes ahead of the heavy request's later queries. Ordering by start, not finish, tags keeps a newly
active client's wait to about one call: its start (the virtual time being served) is at or below
every waiting query's, whereas its finish tag can lie beyond every other client's next expensive
query. A client's share shrinks with the number of clients active at once, not with the size of
their requests. Nothing waits on a timer: an idle service answers a lone
request at once, and under load calls fill with many clients' queries. One worker also means the
retriever is never called concurrently.

A waiter that times out cancels its queued queries; with `encode`, each query's hits are encoded as
they come and counted against the job's `max_bytes` and the shared `budget`.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from drmas_envs.search.retrievers import Passage, Retriever
from drmas_retrieval.limits import ByteBudget

if TYPE_CHECKING:  # the config module is only read for its fields here
    from drmas_retrieval.config import ServiceConfig

logger = logging.getLogger(__name__)

ALIVE_POLL = 0.5
"""Seconds between checks that a waiting request's client is still connected."""


class Overloaded(RuntimeError):
    """Too much is waiting or held; the caller should answer 503 and let the client retry."""


class ClientGone(ConnectionResetError):
    """The client of a waiting job disconnected; its queued queries were dropped."""


class ReplyTooLarge(ValueError):
    """A job's encoded hits exceed its `max_bytes` (answered 413)."""


@dataclass(eq=False)
class _Job:
    queries: list[str]
    k: int
    client: Hashable
    encode: Callable[[list[Passage]], bytes] | None
    max_bytes: int | None
    notify: Callable[[], None] | None
    """Called from the worker thread once the job is answered (wakes an asyncio waiter)."""
    results: list[Any] = field(init=False)
    queued: int = field(init=False)
    left: int = field(init=False)
    nbytes: int = 0
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.results = [None] * len(self.queries)
        self.queued = self.left = len(self.queries)

    def outcome(self) -> list[Any]:
        if self.error is not None:
            raise self.error
        return self.results


class Batcher:
    """Serialises retriever calls, batches concurrent requests together, and shares calls fairly.

    Args:
        retriever: the retriever all requests share.
        max_batch: the most queries per retriever call.
        max_batch_chars: the most query characters per call (one longer query still runs alone).
        max_batch_hits: the most queries x k per call (one query always runs).
        max_pending: the most queries waiting or running; beyond it `submit` raises `Overloaded`.
        max_pending_per_client: the same for one client.
        budget: encoded hits are reserved here (released by the caller after writing them).

    """

    @classmethod
    def from_config(cls, retriever: Retriever, cfg: ServiceConfig, budget: ByteBudget | None = None) -> Batcher:
        """A batcher with a `ServiceConfig`'s batch and queue bounds (both front ends build theirs so)."""
        return cls(
            retriever,
            max_batch=cfg.max_batch,
            max_batch_chars=cfg.max_batch_chars,
            max_batch_hits=cfg.max_batch_hits,
            max_pending=cfg.max_pending,
            max_pending_per_client=cfg.max_pending_per_client,
            budget=budget,
        )

    def __init__(
        self,
        retriever: Retriever,
        *,
        max_batch: int = 256,
        max_batch_chars: int = 1 << 30,
        max_batch_hits: int = 1 << 30,
        max_pending: int = 50_000,
        max_pending_per_client: int | None = None,
        budget: ByteBudget | None = None,
    ):
        self.retriever = retriever
        self.max_batch, self.max_batch_chars, self.max_batch_hits = max_batch, max_batch_chars, max_batch_hits
        self.max_pending = max_pending
        self.max_pending_per_client = max_pending_per_client or max_pending
        self.budget = budget
        self._heap: list[tuple[float, float, int, _Job, int]] = []  # (start, finish, seq, job, index)
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._vtime = 0.0
        self._finish: dict[Hashable, float] = {}
        self._by_client: dict[Hashable, int] = {}
        self._pending = self._dead = 0
        self._closed = False
        self.batches = self.queries = 0
        self._worker = threading.Thread(target=self._run, name="retrieval-batcher", daemon=True)
        self._worker.start()

    @property
    def pending(self) -> int:
        """Queries submitted and not yet answered."""
        return self._pending

    def submit(self, queries: list[str], k: int, timeout: float | None = None, **kw: Any) -> list[Any]:
        """Search `queries` with top-`k` in the next fair batches; blocks until answered.

        Keywords: `client` (whose fair share and queue cap), `encode` (hits -> bytes, done per query in
        the worker; the result is then the encoded pieces), `max_bytes` (their total cap) and `alive`
        (checked every `ALIVE_POLL` s while waiting; False cancels the job).

        Raises:
            Overloaded: the queue (total or this client's) or the shared budget is full.
            ReplyTooLarge: the encoded hits exceed `max_bytes`.
            TimeoutError: no answer within `timeout` seconds (the job's queued queries are dropped).
            ClientGone: `alive()` said the client left (the same).
            Exception: whatever the retriever raised for a batch holding this job.

        """
        alive = kw.pop("alive", None)
        job = self._enqueue(queries, k, **kw)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if job.done.wait(left if alive is None else ALIVE_POLL if left is None else min(left, ALIVE_POLL)):
                break
            if deadline is not None and time.monotonic() >= deadline:
                self._cancel(job, TimeoutError(f"no answer within {timeout} s"))
            elif alive is not None and not alive():
                self._cancel(job, ClientGone("the client went away; its queries were dropped"))
        return job.outcome()

    async def asubmit(self, queries: list[str], k: int, timeout: float | None = None, **kw: Any) -> list[Any]:
        """`submit` for an asyncio event loop: waits without holding a thread; same batches, same errors."""
        loop = asyncio.get_running_loop()
        answered = loop.create_future()

        def wake() -> None:
            if not answered.done():  # a waiter that timed out has cancelled it
                answered.set_result(None)

        job = self._enqueue(queries, k, notify=lambda: loop.call_soon_threadsafe(wake), **kw)
        try:
            await asyncio.wait_for(answered, timeout)
        except asyncio.TimeoutError:  # an alias of TimeoutError only from Python 3.11
            self._cancel(job, TimeoutError(f"no answer within {timeout} s"))
        return job.outcome()

    def _enqueue(
        self,
        queries: list[str],
        k: int,
        client: Hashable = None,
        encode: Callable[[list[Passage]], bytes] | None = None,
        max_bytes: int | None = None,
        notify: Callable[[], None] | None = None,
    ) -> _Job:
        n = len(queries)
        with self._cond:
            if self._closed:
                raise Overloaded("the service is stopping")
            if self._pending + n > self.max_pending:
                raise Overloaded(f"{self._pending} queries waiting (limit {self.max_pending})")
            mine = self._by_client.get(client, 0)
            if mine + n > self.max_pending_per_client:
                raise Overloaded(f"this client has {mine} queries waiting (limit {self.max_pending_per_client})")
            job = _Job(list(queries), int(k), client, encode, max_bytes, notify)
            tag = max(self._vtime, self._finish.get(client, 0.0))
            cost_k = job.k * self.max_batch_chars / self.max_batch_hits  # hits priced in characters
            for i, q in enumerate(job.queries):
                start, tag = tag, tag + len(q) + cost_k + 1
                heapq.heappush(self._heap, (start, tag, next(self._seq), job, i))
            self._finish[client] = tag
            self._pending += n
            self._by_client[client] = mine + n
            self._cond.notify()
        return job

    def _settle(self, job: _Job, n: int) -> None:
        """`n` of `job`'s queries no longer wait (answered or dropped). Holds the lock."""
        if not n:
            return
        self._pending -= n
        left = self._by_client[job.client] - n
        if left:
            self._by_client[job.client] = left
        else:  # an idle client restarts at the current virtual time; the maps stay as small as the queue
            del self._by_client[job.client]
            self._finish.pop(job.client, None)

    def _fail(self, job: _Job, exc: BaseException) -> None:
        """End `job` with `exc`: drop its queued queries and the bytes its pieces hold. Holds the lock."""
        if job.done.is_set():
            return
        job.error, job.results = exc, []
        if self.budget is not None and job.nbytes:
            self.budget.release(job.nbytes)
        job.nbytes = 0
        self._settle(job, job.queued)
        self._dead += job.queued
        job.left -= job.queued
        job.queued = 0
        self._answer(job)

    def _cancel(self, job: _Job, exc: BaseException) -> None:
        with self._cond:
            self._fail(job, exc)

    def _answer(self, job: _Job) -> None:
        job.done.set()
        if job.notify is not None:
            try:
                job.notify()
            except RuntimeError:  # the waiter's event loop has closed (server stopped)
                logger.debug("dropped an answer for a closed event loop")

    def close(self) -> None:
        """Stop the worker after the jobs already queued."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._worker.join(timeout=5)

    def _take_batch(self) -> tuple[list[tuple[_Job, int]], int]:
        """The queries with the smallest start tags that fit one call, and the call's k. Holds the lock."""
        batch: list[tuple[_Job, int]] = []
        chars = k = 0
        while self._heap and len(batch) < self.max_batch:
            start, _, _, job, i = self._heap[0]
            if job.done.is_set():  # cancelled or failed: its queries were settled then
                heapq.heappop(self._heap)
                self._dead -= 1
                continue
            q, kk = job.queries[i], max(k, job.k)
            if batch and (chars + len(q) > self.max_batch_chars or (len(batch) + 1) * kk > self.max_batch_hits):
                break
            heapq.heappop(self._heap)
            batch.append((job, i))
            chars, k = chars + len(q), kk
            job.queued -= 1
            self._vtime = max(self._vtime, start)
        if self._dead > len(self._heap) // 2:  # many cancelled entries: rebuild without them
            self._heap = [e for e in self._heap if not e[3].done.is_set()]
            heapq.heapify(self._heap)
            self._dead = 0
        return batch, k

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap and not self._closed:
                    self._cond.wait()
                if not self._heap:
                    return
                batch, k = self._take_batch()
            if batch:
                self._search(batch, k)

    def _search(self, batch: list[tuple[_Job, int]], k: int) -> None:
        try:
            results = self.retriever.search([job.queries[i] for job, i in batch], k)
        except Exception as exc:  # one failing batch must not stop the service
            logger.exception("retriever failed on a batch of %d queries", len(batch))
            with self._cond:
                for job, _ in batch:
                    self._settle(job, 1)
                    job.left -= 1
                    self._fail(job, exc)
            return
        self.batches += 1
        self.queries += len(batch)
        for (job, i), hits in zip(batch, results):
            hits = hits[: job.k]
            piece = job.encode(hits) if job.encode is not None and not job.done.is_set() else hits
            with self._cond:
                self._settle(job, 1)
                job.left -= 1
                if job.done.is_set():
                    continue
                if job.encode is not None:
                    size = len(piece)
                    if job.max_bytes is not None and job.nbytes + size > job.max_bytes:
                        self._fail(job, ReplyTooLarge(f"the reply would exceed {job.max_bytes} bytes; "
                                                      "ask for fewer queries or a smaller topk"))  # fmt: skip
                        continue
                    if self.budget is not None and not self.budget.try_reserve(size):
                        self._fail(job, Overloaded("the service holds too many replies"))
                        continue
                    job.nbytes += size
                job.results[i] = piece
                if job.left == 0:
                    self._answer(job)
