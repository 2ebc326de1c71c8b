"""Driver-side proxies: what the trainer's loop sees of policies and learners that live in workers."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any


class RemoteBackend:
    """The `Backend` of a policy that lives in a worker; its weights are synced there, after updates."""

    def __init__(self, worker: Any, name: str, tokenizer: Any):
        self.worker, self.name, self.tokenizer = worker, name, tokenizer

    def generate(self, prompts, sampling, *, adapters=None, seed=None):
        import ray

        return ray.get(self.worker.generate.remote(self.name, list(prompts), list(sampling), adapters, seed))

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """A no-op: the worker pushed its weights into its engine after the update (nothing is iterated)."""


@dataclass
class RemotePolicy:
    """Stands in for `models.assignment.Policy` on the driver: what rollout and checkpoints need."""

    name: str
    tokenizer: Any
    backend: RemoteBackend
    agents: list[str]
    worker: Any
    """Rank 0's worker (generation, checkpoints)."""
    ranks: list[Any] = field(default_factory=list)
    """Every rank's worker, rank 0 first (just `worker` without data parallelism)."""
    sharded: bool = False
    """FSDP: reading the weights is a collective, so every rank is asked."""
    adapter: str | None = None
    path: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ranks = self.ranks or [self.worker]

    def trainable(self) -> Iterator[tuple[str, Any]]:
        yield from self.weights().items()

    def weights(self) -> dict[str, Any]:
        """The policy's weights, fetched from its worker (what a checkpoint holds)."""
        import ray

        if self.sharded:
            return ray.get([w.weights.remote(self.name) for w in self.ranks])[0]
        return ray.get(self.worker.weights.remote(self.name))

    def load_weights(self, tensors: dict[str, Any]) -> None:
        """Load checkpointed weights in every rank; rank 0 also pushes them into its engine."""
        import ray

        ray.get([w.load_weights.remote(self.name, tensors) for w in self.ranks])


class RemoteLearner:
    """Stands in for `learner.Learner` on the driver; with data parallelism it drives every rank."""

    def __init__(self, ranks: Sequence[Any], name: str, *, sharded: bool = False):
        self.ranks, self.name, self.sharded = list(ranks), name, sharded

    def update(self, records) -> dict[str, float]:
        """Update on every rank at once (they meet in the gradient all-reduce); rank 0's metrics."""
        import ray

        records = list(records)
        return ray.get([w.update.remote(self.name, records) for w in self.ranks])[0]

    def state_dict(self) -> dict[str, Any]:
        """Rank 0's optimizer state (under FSDP every rank gathers its shards at once)."""
        import ray

        ranks = self.ranks if self.sharded else self.ranks[:1]
        return ray.get([w.learner_state.remote(self.name) for w in ranks])[0]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import ray

        ray.get([w.load_learner_state.remote(self.name, state) for w in self.ranks])
