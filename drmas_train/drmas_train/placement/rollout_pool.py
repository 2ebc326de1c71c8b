"""A rollout pool beside the learner pools: every engine in an `EngineActor` of its own, the learners only train.

    drmas-train --preset smoke --placement shared --set placement.shared_pool.cpus=1 \
        --set placement.rollout_pool.cpus=1 --set rollout.max_staleness=1 --set learner.old_logprobs=decoupled

With `PlacementConfig.rollout_pool` set, the learner workers build their models without an engine
(the transformers wrapper, which costs nothing, stands in) and this module starts one `EngineActor`
per model on each of the rollout pool's bundles (`ranks` replicas; a base and its LoRA adapters are
one model, one engine). The driver's rollout calls the engine actors directly (`RemoteBackend`), so a
learner worker is free to update while they sample: with `rollout.max_staleness` >= 1 generation on
the rollout pool overlaps the update on the learner pools, the split of GPUs between rollout and
training that AReaL, verl's fully-async trainer and ROLL run.

Weights: after each update the learner worker (rank 0 of its pool) pushes the policy's new weights to
every replica through Ray (`PooledBackend`), with the version it now holds; an engine actor runs one
call at a time, so the push lands between two generate requests and each request is stamped with the
version that sampled it (`rollout.versions`). The first push happens when the engines are attached,
before the learner's data-parallel group forms (its module is whole then); a resume pushes the
checkpoint's weights and sets the checkpoint's version. Checkpoints come from the learner workers.

Resources: the engines of a bundle share it equally (CPUs, GPUs; torch threads: the CPU share, at
least 1). A transformers engine holds its own copy of the model (in `models.dtype`), built from the
model folder; the learner's weights replace it at the first push.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from drmas_train.config import PoolSize, TrainConfig
from drmas_train.placement.failures import gather

ROLLOUT_POOL = "rollout"
"""The rollout pool's name in actor names, errors and `drmas-train plan`."""


@dataclass
class EngineGroup:
    """One model's engine: the learner worker that pushes into it and the policies it serves."""

    worker: str
    policies: list[str]
    path: str
    adapters: list[str]
    """LoRA adapters on the model, in the learner's order (assignment lora); [] for a whole model."""


@dataclass
class PoolEngines:
    """A policy's engine replicas on the rollout pool, one per bundle, with their names in errors."""

    actors: list[Any]
    labels: list[str]


def engine_groups(described: dict[str, dict[str, dict[str, Any]]]) -> list[EngineGroup]:
    """One engine per model of each worker (`PolicyWorker.describe` by worker): adapters share their base's."""
    out = []
    for worker, infos in described.items():
        adapters = [p for p, info in infos.items() if info["adapter"] is not None]
        if adapters:
            path = str(infos[adapters[0]]["path"])
            out.append(EngineGroup(worker, adapters, path, [infos[p]["adapter"] for p in adapters]))
        out += [EngineGroup(worker, [p], str(info["path"]), []) for p, info in infos.items() if info["adapter"] is None]
    return out


def start_engines(
    cfg: TrainConfig,
    size: PoolSize,
    pg: Any,
    described: dict[str, dict[str, dict[str, Any]]],
    run_id: str,
    lora_ranks: dict[str, int],
    handles: list[Any],
) -> dict[str, PoolEngines]:
    """Start every model's engine on each bundle of the rollout pool's placement group `pg`.

    Returns:
        Policy name -> its engine replicas (rank 0 first) and their labels ("pool 'rollout' rank 0 (pid 42)").

    Raises:
        WorkerDiedError: an engine actor died while it built its engine.

    """
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from drmas_train.engines import resolve_backend
    from drmas_train.placement.engines import EngineActor

    kind = resolve_backend(cfg.models.backend)
    groups = engine_groups(described)
    share = 1.0 / len(groups)
    threads = int(cfg.threads or max(1, math.floor(size.cpus * share)))
    lora_rank = max([cfg.models.lora_rank, *lora_ranks.values()])
    actors: list[tuple[int, EngineGroup, Any]] = []
    for rank in range(size.ranks):
        for group in groups:
            actor = (
                ray.remote(EngineActor)
                .options(
                    name=f"drmas:{ROLLOUT_POOL}:{group.policies[0]}:rank{rank}:{run_id}",
                    num_cpus=size.cpus * share,
                    num_gpus=size.gpus * share,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=rank),
                )
                .remote(
                    cfg.models,
                    group.path,
                    lora_rank if group.adapters else None,
                    kind,
                    group.adapters if kind == "transformers" else (),
                    lora_ranks,
                    threads,
                )
            )
            handles.append(actor)
            actors.append((rank, group, actor))
    where = [f"pool {ROLLOUT_POOL!r} rank {rank}" for rank, _, _ in actors]
    found = gather([a.where.remote() for *_, a in actors], where, "engine", "", "__init__")
    out: dict[str, PoolEngines] = {}
    for (_, group, actor), label, info in zip(actors, where, found):
        for policy in group.policies:
            engines = out.setdefault(policy, PoolEngines([], []))
            engines.actors.append(actor)
            engines.labels.append(f"{label} (pid {info['pid']})")
    return out


class PooledBackend:
    """A learner worker's side of one policy's engines on the rollout pool: it pushes the policy's weights.

    Every replica takes the same tensors (put in Ray's object store once), stamped with the version
    the worker's `versions` holds for the policy at push time. The driver samples from the replicas
    directly, so this backend never generates.
    """

    def __init__(self, engines: PoolEngines, name: str, tokenizer: Any, versions: dict[str, int]):
        self.engines, self.name, self.tokenizer, self.versions = engines, name, tokenizer, versions

    def generate(self, prompts, sampling, *, adapters=None, seed=None):
        raise RuntimeError(f"policy {self.name!r} generates on the rollout pool: the driver calls its engines")

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        self._push("load_weights", [(n, t.detach().cpu()) for n, t in named_tensors])

    def set_version(self, version: int) -> None:
        """After a resume: the replicas hold the checkpoint's weights, of `version`."""
        refs = [a.set_version.remote(self.name, version) for a in self.engines.actors]
        gather(refs, self.engines.labels, "engine", self.name, "set_version")

    def _push(self, method: str, *args: Any) -> None:
        import ray

        version = self.versions.get(self.name, 0)
        put = [ray.put(a) for a in args]  # one copy in the object store, whatever the number of replicas
        refs = [a.push.remote(self.name, version, method, *put) for a in self.engines.actors]
        gather(refs, self.engines.labels, "engine", self.name, "push")


class PooledVLLMBackend(PooledBackend):
    """`PooledBackend` of vLLM engines: a LoRA policy pushes its adapter's tensors (`policy_ops.sync_engine`)."""

    def load_adapter_tensors(self, name: str, named_tensors: Iterable[tuple[str, Any]], peft_config: dict) -> None:
        self._push("load_adapter_tensors", name, [(n, t.detach().cpu()) for n, t in named_tensors], peft_config)


def pooled_backend(kind: str, engines: PoolEngines, name: str, tokenizer: Any, versions: dict[str, int]) -> Any:
    """The learner-side backend of a policy whose engines (of `kind`) live on the rollout pool."""
    cls = PooledVLLMBackend if kind == "vllm" else PooledBackend
    return cls(engines, name, tokenizer, versions)


def check_worker_names(names: Sequence[str]) -> None:
    """A worker named like the rollout pool would make errors and actor names ambiguous."""
    if ROLLOUT_POOL in names:
        raise ValueError(f"a worker is named {ROLLOUT_POOL!r}, the rollout pool's name; rename the agent")
