"""One interface for the trainer's models wherever they run: in this process, or in Ray workers.

The trainer's loop touches its models only through `Workers`: `update` one policy on its records,
`publish` the step's weight version, `hold` the engines still (a rollout batch, a validation pass),
`load` a checkpoint, `close`. In a synchronous run (`rollout.max_staleness` 0), after `update` and
`load` the policy's generation engine holds the new weights, so the next rollout is on-policy, in
both implementations:

- `LocalWorkers` (`placement.mode: none`): policies and learners in this process; it pushes the
  weights into the engine itself (`policy_ops.sync_engine`) and reports how long that took.
- `PlacedWorkers` (`placement.mode: shared | per_agent`): the proxies of `drmas_train.placement`;
  each worker pushes into its own engine inside its update (no weights cross the driver), or, with
  `placement.rollout_pool`, into its models' engine actors on the rollout pool, through Ray.

With `models.engine.sleep` every engine sleeps between its generations and takes the current weights
at each wake (`engines.sleep`); a push after an update then only counts where the engine is awake.

With `rollout.max_staleness` >= 1 (`drmas_train.rollout.pipeline`) `LocalWorkers` gives each engine
a copy of its module and pushes every policy at once in `publish`, between two rollout batches; placed
workers keep pushing after their update, between two requests.

Both hold `policies` (what rollout and checkpoints read) and `learners` (what checkpoints read).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from drmas_train.algorithm.records import CallRecord
from drmas_train.config import TrainConfig
from drmas_train.engines.assignment import build_policies
from drmas_train.engines.sleep import sleep_engines
from drmas_train.learner.memory import read_peaks
from drmas_train.learner.policy_ops import load_policy_weights, make_learner, sync_engine
from drmas_train.learner.policy_shards import local_bytes, read_policy, write_policy
from drmas_train.rollout.versions import WeightClock, version_engines


class LocalWorkers:
    """Policies and learners in this process; engines are synced here, after building, updates and loads."""

    def __init__(self, cfg: TrainConfig, agents: Sequence[str], lora_ranks: dict[str, int]):
        self.policies = build_policies(cfg.models, list(agents), seed=cfg.seed, lora_ranks=lora_ranks)
        self.learners = {name: make_learner(cfg, p) for name, p in self.policies.items()}
        self.overlap = cfg.rollout.max_staleness > 0
        """Whether rollouts run while the learners update: engines then have modules of their own."""
        if self.overlap:
            from drmas_train.placement.engines import give_engines_their_own_copy

            give_engines_their_own_copy(self.policies, cfg.models.max_gen_batch)
        if cfg.models.engine.sleep:  # each generation: wake, push the module's weights, generate, sleep
            sleep_engines(self.policies)
        self.clock = WeightClock()
        version_engines(self.policies.values(), self.clock)
        self.sync_seconds = 0.0
        """Seconds the last `update` (or `publish`, with overlap) spent pushing weights into the engines."""
        for policy in self.policies.values():
            sync_engine(policy)

    def update(self, name: str, records: Sequence[CallRecord]) -> dict[str, float]:
        """Train policy `name` on its records, then (without overlap) push the new weights into its engine."""
        metrics = self.learners[name].update(records)
        t0 = time.perf_counter()
        if not self.overlap:  # the engine is idle: push now, as the synchronous loop always did
            sync_engine(self.policies[name])
        self.sync_seconds = time.perf_counter() - t0
        return metrics

    def publish(self, version: int) -> None:
        """The engines now serve weight version `version`; with overlap, push every policy at once, between batches."""
        t0 = time.perf_counter()
        if self.overlap:
            self.clock.push(version, lambda: [sync_engine(p) for p in self.policies.values()])
        else:
            self.clock.push(version)
        self.sync_seconds = time.perf_counter() - t0

    def set_version(self, version: int) -> None:
        """After a resume: the engines hold the checkpoint's weights, of version `version`."""
        self.clock.version = version

    def hold(self) -> contextlib.AbstractContextManager[int]:
        """Keep the engines' weights still while a batch or a validation pass runs (yields their version)."""
        return self.clock.hold()

    def load(self, name: str, weights: dict[str, Any], learner_state: dict[str, Any]) -> None:
        """Load a checkpoint's weights and optimizer state of policy `name`, and sync its engine."""
        load_policy_weights(self.policies[name], weights)
        self.learners[name].load_state_dict(learner_state)
        sync_engine(self.policies[name])

    def checkpoint_bytes(self) -> int:
        """The bytes a checkpoint of every policy takes."""
        return sum(local_bytes(p, self.learners[n], sharded=False) for n, p in self.policies.items())

    def save_shards(self, folder: Path) -> dict[str, list[int]]:
        """Write every policy whole into the checkpoint folder, as rank 0; per policy, the ranks that wrote."""
        for name, policy in self.policies.items():
            write_policy(folder, name, policy, self.learners[name], rank=0, sharded=False)
        return {name: [0] for name in self.policies}

    def load_shards(self, name: str, folder: Path) -> None:
        """Load policy `name` from a sharded checkpoint (whatever rank count wrote it) and sync its engine."""
        weights, state = read_policy(folder, name, self.policies[name], self.learners[name])
        self.load(name, weights, state)

    def memory(self) -> dict[str, float]:
        """The memory peaks of this process since the last call, as `mem/process/0/<peak>` metrics."""
        return {f"mem/process/0/{k}": v for k, v in read_peaks().items()}

    def close(self) -> None:
        """Nothing to free: the models go with this process."""


class PlacedWorkers:
    """The Ray workers of a placed run, through their driver-side proxies (`placement.proxies`)."""

    def __init__(self, cfg: TrainConfig, agents: Sequence[str], lora_ranks: dict[str, int]):
        from drmas_train import placement

        self.handles: list[Any] = []
        sizes = placement.pool_sizes(cfg.placement, cfg.models.assignment, list(agents))
        if cfg.placement.rollout_pool is not None:  # Ray's CPUs count it too
            sizes[placement.ROLLOUT_POOL] = cfg.placement.rollout_pool
        self.own_ray = placement.start_ray(cfg.placement, sizes)
        try:
            self.policies, self.learners, self.handles = placement.build_placed(
                cfg, list(agents), cfg.placement, lora_ranks, handles=self.handles
            )
        except BaseException:
            self.close()
            raise
        self.sync_seconds = 0.0
        """Always 0: a worker syncs its engine inside its update (counted in the update's time)."""

    def update(self, name: str, records: Sequence[CallRecord]) -> dict[str, float]:
        """Update on every rank of the policy's pool; its workers then sync their engines."""
        return self.learners[name].update(records)

    def publish(self, version: int) -> None:
        """Nothing to do: each worker pushed into its engine after its update and counts its own versions."""

    def set_version(self, version: int) -> None:
        """After a resume: every rank's engines hold the checkpoint's weights, of version `version`."""
        import ray

        ray.get([w.set_version.remote(n, version) for n, p in self.policies.items() for w in p.ranks])

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Nothing to hold on the driver: a worker runs one call at a time (requests and pushes never overlap)."""
        yield None

    def load(self, name: str, weights: dict[str, Any], learner_state: dict[str, Any]) -> None:
        """Load into every rank; the workers sync their engines."""
        self.policies[name].load_weights(weights)
        self.learners[name].load_state_dict(learner_state)

    def checkpoint_bytes(self) -> int:
        """The bytes a checkpoint of every policy takes (each writing rank counts its own shard)."""
        return sum(p.shard_bytes() for p in self.policies.values())

    def save_shards(self, folder: Path) -> dict[str, list[int]]:
        """Each policy's writing ranks write their own shards into the folder; per policy, the ranks that wrote."""
        return {name: p.save_shards(str(folder)) for name, p in self.policies.items()}

    def load_shards(self, name: str, folder: Path) -> None:
        """Every rank of policy `name` reads its part of a sharded checkpoint and syncs its engines."""
        self.policies[name].load_shards(str(folder))

    def memory(self) -> dict[str, float]:
        """Every worker's memory peaks since the last call, as `mem/<pool>/<rank>/<peak>` metrics."""
        from drmas_train.placement.failures import gather

        seen: dict[tuple[str, int], tuple[Any, str]] = {}
        for p in self.policies.values():  # workers of a shared pool hold several policies: ask each once
            for rank, worker in enumerate(p.ranks):
                seen.setdefault((p.pool, rank), (worker, p.labels[rank]))
        refs = [w.memory.remote() for w, _ in seen.values()]
        peaks = gather(refs, [label for _, label in seen.values()], "worker", "", "memory")
        return {f"mem/{pool}/{rank}/{k}": v for (pool, rank), got in zip(seen, peaks) for k, v in got.items()}

    def close(self) -> None:
        """Free the workers and placement groups, and Ray itself when this run started it (idempotent)."""
        from drmas_train import placement

        handles, self.handles = self.handles, []
        if handles:
            placement.shutdown(handles)
        if self.own_ray:
            import ray

            self.own_ray = False
            ray.shutdown()


Workers = LocalWorkers | PlacedWorkers
