"""Driver-side proxies: what the trainer's loop sees of policies and learners that live in workers."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from drmas_train.placement.failures import gather


def split_rows(n: int, parts: int) -> list[slice]:
    """Split n rows into `parts` contiguous slices whose sizes differ by at most one (the first are longer)."""
    size, extra = divmod(n, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + size + (i < extra))
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]


class RemoteBackend:
    """The `Backend` of a policy that lives in workers; its weights are synced there, after updates.

    With several generating ranks (`PlacementConfig.rollout_ranks: all`) a call's rows are split into
    contiguous shares, one per rank, sampled at once and put back in order. Each row keeps its own
    seed (`backends.base.row_seeds`), so the samples do not depend on the split. `labels` name the
    workers in the error raised when one dies (`placement.failures`). With sleeping engines
    (`models.engine.sleep`) every rank of the pool, `wake_ranks`, wakes its engine before a call (under
    FSDP they gather the weights together) and puts it back to sleep after.
    """

    def __init__(
        self,
        workers: Sequence[Any],
        name: str,
        tokenizer: Any,
        labels: Sequence[str] = (),
        wake_ranks: Sequence[Any] = (),
        wake_labels: Sequence[str] = (),
    ):
        self.workers, self.name, self.tokenizer = list(workers), name, tokenizer
        self.labels = list(labels) or [f"worker {i}" for i in range(len(self.workers))]
        self.wake_ranks = list(wake_ranks)
        self.wake_labels = list(wake_labels) or [f"rank {i}" for i in range(len(self.wake_ranks))]

    def _every_rank(self, call: str) -> None:
        """`call` (wake or sleep_engine) on every rank of the pool at once; nothing without sleeping engines."""
        if self.wake_ranks:
            refs = [getattr(w, call).remote(self.name) for w in self.wake_ranks]
            gather(refs, self.wake_labels, "engine", self.name, call)

    def generate(self, prompts, sampling, *, adapters=None, seed=None):
        from drmas_train.engines.base import row_seeds

        prompts, sampling = list(prompts), list(sampling)
        adapters = None if adapters is None else list(adapters)
        seeds = row_seeds(seed, len(prompts))
        shares = [s for s in split_rows(len(prompts), len(self.workers)) if s.stop > s.start]
        self._every_rank("wake")
        pending = [
            worker.generate.remote(
                self.name,
                prompts[s],
                sampling[s],
                None if adapters is None else adapters[s],
                None if seeds is None else seeds[s],
            )
            for worker, s in zip(self.workers, shares)
        ]
        results = gather(pending, self.labels, "engine", self.name, "generate")
        self._every_rank("sleep_engine")
        return [gen for share in results for gen in share]

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
    """Rank 0's worker (checkpoints)."""
    ranks: list[Any] = field(default_factory=list)
    """Every rank's worker, rank 0 first (just `worker` without data parallelism)."""
    sharded: bool = False
    """FSDP: reading the weights is a collective, so every rank is asked."""
    adapter: str | None = None
    path: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)
    """Each rank's name in errors (`placement.failures`): pool, rank and pid."""
    pool: str = ""
    """The pool its workers run on (metrics name it: `mem/<pool>/<rank>/...`)."""

    def __post_init__(self) -> None:
        self.ranks = self.ranks or [self.worker]
        self.labels = self.labels or [f"rank {i}" for i in range(len(self.ranks))]

    def trainable(self) -> Iterator[tuple[str, Any]]:
        yield from self.weights().items()

    def weights(self) -> dict[str, Any]:
        """The policy's weights, fetched from its worker (what a checkpoint holds)."""
        ranks = self.ranks if self.sharded else self.ranks[:1]
        return gather([w.weights.remote(self.name) for w in ranks], self.labels, "learner", self.name, "weights")[0]

    def load_weights(self, tensors: dict[str, Any]) -> None:
        """Load checkpointed weights in every rank; rank 0 also pushes them into its engine."""
        refs = [w.load_weights.remote(self.name, tensors) for w in self.ranks]
        gather(refs, self.labels, "learner", self.name, "load_weights")

    def writers(self) -> list[int]:
        """The ranks that write a checkpoint: every rank under FSDP (its own shards), else rank 0."""
        return list(range(len(self.ranks))) if self.sharded else [0]

    def shard_bytes(self) -> int:
        """The bytes the writing ranks will write for this policy (weights and learner state)."""
        refs = [self.ranks[r].shard_bytes.remote(self.name) for r in self.writers()]
        return sum(gather(refs, self.labels, "learner", self.name, "shard_bytes"))

    def save_shards(self, folder: str) -> list[int]:
        """Each writing rank writes its own shard into `folder` (shared by every node); the ranks that wrote."""
        ranks = self.writers()
        gather(
            [self.ranks[r].save_shard.remote(self.name, folder) for r in ranks],
            self.labels,
            "learner",
            self.name,
            "save_shard",
        )
        return ranks

    def load_shards(self, folder: str) -> None:
        """Every rank reads its part of a sharded checkpoint (weights and learner state) and syncs its engine."""
        refs = [w.load_shard.remote(self.name, folder) for w in self.ranks]
        gather(refs, self.labels, "learner", self.name, "load_shard")


class RemoteLearner:
    """Stands in for `learner.Learner` on the driver; with data parallelism it drives every rank."""

    def __init__(self, ranks: Sequence[Any], name: str, *, sharded: bool = False, labels: Sequence[str] = ()):
        self.ranks, self.name, self.sharded = list(ranks), name, sharded
        self.labels = list(labels) or [f"rank {i}" for i in range(len(self.ranks))]

    def _gather(self, refs: list[Any], call: str) -> list[Any]:
        return gather(refs, self.labels, "learner", self.name, call)

    def update(self, records) -> dict[str, float]:
        """Update on every rank at once (they meet in the gradient all-reduce); rank 0's metrics."""
        records = list(records)
        return self._gather([w.update.remote(self.name, records) for w in self.ranks], "update")[0]

    def state_dict(self) -> dict[str, Any]:
        """Rank 0's optimizer state (under FSDP every rank gathers its shards at once)."""
        ranks = self.ranks if self.sharded else self.ranks[:1]
        return self._gather([w.learner_state.remote(self.name) for w in ranks], "learner_state")[0]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._gather([w.load_learner_state.remote(self.name, state) for w in self.ranks], "load_learner_state")
