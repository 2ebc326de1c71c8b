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
