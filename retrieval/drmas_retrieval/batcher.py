"""Dynamic batching: requests from many connections share one retriever call.

Handlers put jobs on a queue (threads through `submit`, asyncio tasks through `asubmit`); one worker
thread takes the first job, drains whatever else is already waiting (up to `max_batch` queries), runs
one `search` for all of them with the largest k asked for, and hands each job its own slice trimmed
to its k. Nothing waits on a timer: under light load a request runs alone at once; under heavy load
the queue fills while the worker is busy, so batches grow with the load. One worker also means the
retriever is never called concurrently.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from drmas_envs.search.retrievers import Passage, Retriever

logger = logging.getLogger(__name__)


class Overloaded(RuntimeError):
    """Too many queries are waiting; the caller should answer 503 and let the client retry."""


@dataclass
class _Job:
    queries: list[str]
    k: int
    done: threading.Event = field(default_factory=threading.Event)
    result: list[list[Passage]] | None = None
    error: BaseException | None = None
    notify: Callable[[], None] | None = None
    """Called from the worker thread once the job is answered (wakes an asyncio waiter)."""

    def outcome(self) -> list[list[Passage]]:
        if self.error is not None:
            raise self.error
        return self.result


class Batcher:
    """Serialises retriever calls and batches concurrent requests together.

    Args:
        retriever: the retriever all requests share.
        max_batch: the most queries per retriever call (one larger request still runs whole).
        max_pending: the most queries waiting; beyond it `submit` raises `Overloaded`.

    """

    def __init__(self, retriever: Retriever, *, max_batch: int = 256, max_pending: int = 50_000):
        self.retriever = retriever
        self.max_batch = max_batch
        self.max_pending = max_pending
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._pending = 0
        self._lock = threading.Lock()
        self.batches = 0
        self.queries = 0
        self._worker = threading.Thread(target=self._run, name="retrieval-batcher", daemon=True)
        self._worker.start()

    @property
    def pending(self) -> int:
        """Queries submitted and not yet answered."""
        return self._pending

    def submit(self, queries: list[str], k: int, timeout: float | None = None) -> list[list[Passage]]:
        """Search `queries` with top-`k` as part of the next batch; blocks until answered.

        Raises:
            Overloaded: the queue is full.
            TimeoutError: no answer within `timeout` seconds.
            Exception: whatever the retriever raised for this batch.

        """
        job = self._enqueue(queries, k)
        if not job.done.wait(timeout):
            raise TimeoutError(f"no answer within {timeout} s")
        return job.outcome()

    async def asubmit(self, queries: list[str], k: int, timeout: float | None = None) -> list[list[Passage]]:
        """`submit` for an asyncio event loop: waits without holding a thread; same batches, same errors."""
        loop = asyncio.get_running_loop()
        answered = loop.create_future()

        def wake() -> None:
            if not answered.done():  # a waiter that timed out has cancelled it
                answered.set_result(None)

        job = self._enqueue(queries, k, notify=lambda: loop.call_soon_threadsafe(wake))
        try:
            await asyncio.wait_for(answered, timeout)
        except asyncio.TimeoutError:  # an alias of TimeoutError only from Python 3.11
            raise TimeoutError(f"no answer within {timeout} s") from None
        return job.outcome()

    def _enqueue(self, queries: list[str], k: int, notify: Callable[[], None] | None = None) -> _Job:
        with self._lock:
            if self._pending + len(queries) > self.max_pending:
                raise Overloaded(f"{self._pending} queries waiting (limit {self.max_pending})")
            self._pending += len(queries)
        job = _Job(list(queries), int(k), notify=notify)
        self._queue.put(job)
        return job

    def close(self) -> None:
        """Stop the worker after the jobs already queued."""
        self._queue.put(None)
        self._worker.join(timeout=5)

    def _take_batch(self, first: _Job) -> list[_Job]:
        batch, n = [first], len(first.queries)
        while n < self.max_batch:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:  # close() while draining: put the sentinel back for the main loop
                self._queue.put(None)
                break
            batch.append(job)
            n += len(job.queries)
        return batch

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = self._take_batch(first)
            queries = [q for job in batch for q in job.queries]
            try:
                results = self.retriever.search(queries, max(job.k for job in batch))
            except Exception as exc:  # one failing batch must not stop the service
                logger.exception("retriever failed on a batch of %d queries", len(queries))
                for job in batch:
                    job.error = exc
            else:
                start = 0
                for job in batch:
                    job.result = [hits[: job.k] for hits in results[start : start + len(job.queries)]]
                    start += len(job.queries)
            self.batches += 1
            self.queries += len(queries)
            with self._lock:
                self._pending -= len(queries)
            for job in batch:
                job.done.set()
                if job.notify is not None:
                    try:
                        job.notify()
                    except RuntimeError:  # the waiter's event loop has closed (server stopped)
                        logger.debug("dropped an answer for a closed event loop")
