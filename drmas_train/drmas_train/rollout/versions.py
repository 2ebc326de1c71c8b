"""Weight versions: which weights sampled each call, pushes that never split a request, and staleness.

A weight version is the number of training steps the weights have taken (0: the initial weights). In
this process one `WeightClock` is shared by every engine of the run. Its lock is held by every
generation request from start to end (`VersionedBackend`, which stamps the request's rows with the
version), and by the producer for a whole rollout batch and by validation for a whole pass
(`WeightClock.hold`; it is re-entrant); a push (`WeightClock.push`) takes the same lock, so it lands
between two batches, never inside a request or a batch, and it moves every engine to the new version
at once (no request for one agent sees another agent's model a version ahead). In a placed run the
worker (a Ray actor, which runs one call at a time) stamps its rows instead, and pushes between requests;
with a rollout pool (`placement.rollout_pool`) the engine actor does, and takes the worker's pushes.

The staleness of a call trained at step t (the update from version t - 1 to t) is
`t - 1 - weight_version`; `rollout.max_staleness` bounds it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from drmas_train.algorithm.records import CallRecord


class WeightClock:
    """The version of the weights the engines of this process hold, and the lock that orders their use and pushes."""

    def __init__(self, version: int = 0):
        self.version = version
        self.lock = threading.RLock()

    def push(self, version: int, apply: Callable[[], None] = lambda: None) -> None:
        """Run `apply` (copy new weights into the engines) while nobody holds them, then set `version`."""
        with self.lock:
            apply()
            self.version = version

    @contextmanager
    def hold(self) -> Iterator[int]:
        """Keep the weights from changing for a request, a batch or a validation pass; yields their version."""
        with self.lock:
            yield self.version


class VersionedBackend:
    """A `Backend` whose requests run under a `WeightClock` and come back stamped with its version.

    Everything but `generate` is the wrapped engine's own (weights are pushed into it directly, inside
    `WeightClock.push`).
    """

    def __init__(self, inner: Any, clock: WeightClock):
        self.inner, self.clock = inner, clock
        self.tokenizer = inner.tokenizer

    def generate(self, prompts, sampling, *, adapters=None, seed=None):
        with self.clock.hold() as version:
            gens = self.inner.generate(prompts, sampling, adapters=adapters, seed=seed)
        for gen in gens:
            gen.version = version
        return gens

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def version_engines(policies: Iterable[Any], clock: WeightClock) -> None:
    """Wrap each distinct engine of the policies in one `VersionedBackend` (policies sharing one keep sharing)."""
    wrapped: dict[int, VersionedBackend] = {}
    for policy in policies:
        key = id(policy.backend)
        if key not in wrapped:
            wrapped[key] = VersionedBackend(policy.backend, clock)
        policy.backend = wrapped[key]


def staleness(records: Sequence[CallRecord], trained_version: int) -> np.ndarray:
    """Per record, how many versions older than `trained_version` (the weights the update starts from) it is."""
    return np.array([trained_version - r.weight_version for r in records if r.weight_version is not None], dtype=float)


def staleness_stats(records: Sequence[CallRecord], trained_version: int) -> dict[str, float]:
    """`rollout/staleness_mean` and `rollout/staleness_max` of a step's records ({} when none is versioned)."""
    lag = staleness(records, trained_version)
    if lag.size == 0:
        return {}
    return {"rollout/staleness_mean": float(lag.mean()), "rollout/staleness_max": float(lag.max())}


def drop_stale_groups(records: Sequence[CallRecord], trained_version: int, max_staleness: int) -> list[CallRecord]:
    """The records of the prompt groups none of whose calls is more than `max_staleness` versions old.

    A whole group goes when one call is too old, so each kept group still holds every episode of its
    task (its advantages compare the same n episodes as in a synchronous step).
    """
    stale = {
        r.group_id
        for r in records
        if r.weight_version is not None and trained_version - r.weight_version > max_staleness
    }
    return [r for r in records if r.group_id not in stale]
