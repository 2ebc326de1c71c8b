"""A policy backed by any OpenAI-compatible chat-completions server (vLLM, SGLang, llama.cpp, OpenAI).

    policy = OpenAIChatPolicy("http://127.0.0.1:8000/v1", "Qwen/Qwen3-4B", sampling=ChatSampling(temperature=0.6))
    drmas_envs.evaluate(policy, "math-2agent", k=16)

Each observation becomes one request with the [system, user] messages the env wrote. An observation
with a `reply_prefix` adds it as a final assistant message and asks the server to continue that
message (`continue_final_message`, as vLLM's and SGLang's chat servers accept); the reply text is
then the continuation, which the env appends to the prefix. A batch is
sent concurrently through a bounded thread pool; failures that may pass (connection errors,
timeouts, HTTP 408/409/429 and 5xx) are retried with exponential backoff a bounded number of times;
any other error response raises `OpenAIPolicyError` with the server's message. A reply without
text (a refusal, a null content) becomes "" and is then a malformed action, penalised by the env.

Sampling seeds: with `seed` set, the n-th request this policy sends carries `seed + n`, so a run
in the same order is reproducible on servers that honour `seed`, and the k episodes of one problem
still differ. Only `requests` is used here: no torch, no OpenAI SDK.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import requests

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class OpenAIPolicyError(RuntimeError):
    """The server refused a request, or kept failing after every retry."""


@dataclass(frozen=True)
class ChatSampling:
    """Sampling settings of one agent's requests."""

    temperature: float = 1.0
    """0 is greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    max_tokens: int = 1024
    """The longest reply in tokens."""
    stop: tuple[str, ...] = ()
    """Strings that end a reply (not included in it)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Further request fields passed as is (for example vLLM's `top_k`, `repetition_penalty`)."""

    def body(self) -> dict[str, Any]:
        """The request fields these settings set."""
        out: dict[str, Any] = {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}
        if self.stop:
            out["stop"] = list(self.stop)
        out.update(self.extra)
        return out


@dataclass
class Usage:
    """Token and request counts of a policy so far (as the server reported them)."""

    requests: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


class OpenAIChatPolicy:
    """`policy(agent, observations) -> texts` over an OpenAI-compatible `/chat/completions` endpoint.

    Args:
        base_url: the API root, e.g. "http://127.0.0.1:8000/v1".
        model: the served model name.
        sampling: the settings every agent uses unless `agent_sampling` names it.
        agent_sampling: per-agent settings, by agent name.
        api_key: sent as a bearer token; defaults to $OPENAI_API_KEY, none if unset.
        max_concurrency: requests in flight at once.
        timeout: seconds to wait for one response (connect and read).
        max_retries: further attempts after a retryable failure.
        backoff: seconds before the first retry; doubles each time.
        seed: when set, the n-th request sent carries `seed + n`.

    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        sampling: ChatSampling | None = None,
        agent_sampling: Mapping[str, ChatSampling] | None = None,
        api_key: str | None = None,
        max_concurrency: int = 16,
        timeout: float = 300.0,
        max_retries: int = 3,
        backoff: float = 1.0,
        seed: int | None = None,
    ):
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.sampling = sampling or ChatSampling()
        self.agent_sampling = dict(agent_sampling or {})
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.seed = seed
        self.usage = Usage()
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None

    # -- the policy ---------------------------------------------------------------------------------
    def __call__(self, agent: str, observations: Sequence[Mapping[str, Any]]) -> list[str]:
        """Answer each observation of `agent` with one reply text, in order."""
        bodies = [self.request_body(agent, obs) for obs in observations]
        if len(bodies) <= 1:
            return [self._complete(b) for b in bodies]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.max_concurrency, thread_name_prefix="openai-policy")
        return list(self._pool.map(self._complete, bodies))

    def request_body(self, agent: str, observation: Mapping[str, Any]) -> dict[str, Any]:
        """The JSON body for one observation (seeds are numbered in the order bodies are made)."""
        messages = [
            {"role": "system", "content": str(observation.get("system", ""))},
            {"role": "user", "content": str(observation.get("user", ""))},
        ]
        body = {"model": self.model, "messages": messages, "n": 1, **self.sampling_for(agent).body()}
        prefix = str(observation.get("reply_prefix") or "")
        if prefix:  # the reply starts with text written for the model: ask the server to continue it
            messages.append({"role": "assistant", "content": prefix})
            body.update(continue_final_message=True, add_generation_prompt=False)
        if self.seed is not None:
            body["seed"] = self.seed + next(self._counter)
        return body

    def sampling_for(self, agent: str) -> ChatSampling:
        """The settings `agent`'s requests use."""
        return self.agent_sampling.get(agent, self.sampling)

    # -- HTTP -----------------------------------------------------------------------------------------
    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:  # Sessions are not thread-safe: one per worker thread.
            session = self._local.session = requests.Session()
        return session

    def _complete(self, body: dict[str, Any]) -> str:
        """Send one request, retrying what may pass; return the reply text."""
        delay = self.backoff
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                resp = self._session().post(self.url, json=body, headers=self.headers, timeout=self.timeout)
            except (requests.ConnectionError, requests.Timeout) as e:
                if last:
                    raise OpenAIPolicyError(
                        f"{self.url}: no response after {attempt + 1} attempts ({type(e).__name__}: {e})"
                    ) from e
                reason = type(e).__name__
            else:
                if resp.status_code == 200:
                    return self._parse(resp)
                if resp.status_code not in RETRY_STATUS or last:
                    raise OpenAIPolicyError(
                        f"{self.url}: HTTP {resp.status_code} after {attempt + 1} attempts: {_error_text(resp)}"
                    )
                reason = f"HTTP {resp.status_code}"
            log.warning("chat request failed (%s); retry %d/%d in %.1fs", reason, attempt + 1, self.max_retries, delay)
            with self._lock:
                self.usage.retries += 1
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    def _parse(self, resp: requests.Response) -> str:
        try:
            data = resp.json()
            choice = data["choices"][0]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise OpenAIPolicyError(f"{self.url}: malformed response: {resp.text[:300]!r}") from e
        usage = data.get("usage") or {}
        with self._lock:
            self.usage.requests += 1
            self.usage.prompt_tokens += int(usage.get("prompt_tokens") or 0)
            self.usage.completion_tokens += int(usage.get("completion_tokens") or 0)
        content = (choice.get("message") or {}).get("content")
        return content if isinstance(content, str) else ""

    def close(self) -> None:
        """Stop the worker threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> OpenAIChatPolicy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> dict[str, Any]:
        """The settings, for logs and result files (no API key)."""
        return {
            "base_url": self.url.removesuffix("/chat/completions"),
            "model": self.model,
            "sampling": asdict(self.sampling),
            "agent_sampling": {a: asdict(s) for a, s in self.agent_sampling.items()},
            "seed": self.seed,
        }


def _error_text(resp: requests.Response) -> str:
    """The server's error message if it sent one in the OpenAI format, else the body's start."""
    try:
        err = resp.json().get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:500]
    except (ValueError, AttributeError):
        pass
    return resp.text[:500]
