"""Spies on real components for the training tests: they record what passes through and change nothing."""

from __future__ import annotations

from typing import Any


def record_prompts(backend: Any) -> list[list[int]]:
    """Wrap `backend.generate` so every prompt it is given is kept; return the (growing) list of them."""
    real, seen = backend.generate, []

    def recording(prompts, sampling, **kwargs):  # the real engine, with its inputs kept
        seen.extend(prompts)
        return real(prompts, sampling, **kwargs)

    backend.generate = recording
    return seen


SLEEP_CALLS = ("sleep", "wake_weights", "load_weights", "wake_cache", "generate")


def record_engine_calls(backend: Any, order: list | None = None, tag: str = "") -> list:
    """Wrap a real engine's sleep, wake, push and generate calls so their order is kept; return that list.

    `order`: a list to append to (several engines' calls in one order); `tag`: then each entry is (tag, call).
    """
    order = [] if order is None else order

    def keep(name: str) -> None:
        real = getattr(backend, name)

        def recording(*args, **kwargs):  # the real call, its name kept
            order.append((tag, name) if tag else name)
            return real(*args, **kwargs)

        setattr(backend, name, recording)

    for name in SLEEP_CALLS:
        keep(name)
    return order
