"""A client of a retrieval service speaking the Search-R1 protocol (POST /retrieve)."""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any

import requests

from drmas_envs.search.retrievers.base import Passage, split_contents
from drmas_envs.services import ServiceError

logger = logging.getLogger(__name__)


class RetrievalServiceError(ServiceError):
    """The retrieval service is unreachable, or answered with an error or a malformed reply."""


class HTTPRetriever:
    """Top-k passages from a retrieval service, e.g. `drmas-retrieval serve` or Search-R1's server.

    Args:
        url: the service base URL ("http://127.0.0.1:8000"); "/retrieve" is appended if missing.
        timeout: seconds per attempt (connect and read).
        retries: extra attempts after a connection error, timeout or 5xx/429 reply.
        backoff: the first wait between attempts in seconds; it doubles each time.

    One `requests.Session` per thread keeps connections alive between calls.

    """

    def __init__(self, url: str, *, timeout: float = 30.0, retries: int = 3, backoff: float = 0.2):
        base = url.rstrip("/")
        self.url = base if base.endswith("/retrieve") else f"{base}/retrieve"
        self.timeout = timeout
        self.retries = max(0, int(retries))
        self.backoff = backoff
        self._local = threading.local()

    @property
    def session(self) -> requests.Session:
        """The calling thread's session (requests.Session is not safe to share across threads)."""
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        return self._local.session

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """One list of at most `k` passages per query, best first.

        Raises:
            RetrievalServiceError: the service stayed unreachable or failing after all retries, refused
                the request (4xx), or sent a reply that does not follow the protocol.

        """
        if not queries:
            return []
        payload = {"queries": list(queries), "topk": int(k), "return_scores": True}
        body = self._post(payload)
        result = body.get("result") if isinstance(body, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise RetrievalServiceError(
                f"{self.url}: malformed reply, expected 'result' with {len(queries)} lists", self.url
            )
        return [[self._passage(hit) for hit in hits] for hits in result]

    def _post(self, payload: dict[str, Any]) -> Any:
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                reply = self.session.post(self.url, json=payload, timeout=self.timeout)
            except (requests.ConnectionError, requests.Timeout) as exc:
                last = _reason(exc)
                logger.warning("retrieval service %s: attempt %d failed: %s", self.url, attempt + 1, last)
                continue
            if reply.status_code == 429 or reply.status_code >= 500:
                last = f"HTTP {reply.status_code}: {reply.text[:200]}"
                continue
            if reply.status_code >= 400:
                raise RetrievalServiceError(
                    f"{self.url} refused the request: HTTP {reply.status_code}: {reply.text[:500]}", self.url
                )
            try:
                return reply.json()
            except ValueError:
                raise RetrievalServiceError(f"{self.url}: reply is not JSON: {reply.text[:200]!r}", self.url) from None
        raise RetrievalServiceError(
            f"retrieval service at {self.url} failed after {self.retries + 1} attempts ({last}). "
            "Is it running? Start one with `drmas-retrieval serve --index DIR`.",
            self.url,
        )

    def _passage(self, hit: Any) -> Passage:
        try:
            doc = hit["document"] if "document" in hit else hit
            title, text = (doc["title"], doc["text"]) if "text" in doc else split_contents(doc["contents"])
            return Passage(str(doc.get("id", "")), str(title), str(text), float(hit.get("score", 0.0)))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise RetrievalServiceError(f"{self.url}: malformed hit in reply: {str(hit)[:200]}", self.url) from None


def _reason(exc: requests.RequestException) -> str:
    """A failed attempt in a few words: the OS error ("[Errno 111] Connection refused") where there is one."""
    found = re.search(r"\[Errno -?\d+\][^'\")]*", str(exc))
    return f"{type(exc).__name__}: {found.group(0).strip() if found else exc}"
