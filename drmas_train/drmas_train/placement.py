"""Ray resource pools: run each model's engine and learner in a Ray actor, on a shared or per-model pool.

    drmas-train --preset smoke --assignment per_agent --placement per_agent \
        --set placement.pools.solver.cpus=1 --set placement.pools.verifier.cpus=1

The `placement` section of `TrainConfig` (a `PlacementConfig`) selects it; `Trainer` then builds its
policies here with `build_placed` (the models are never loaded on the driver), runs its unchanged loop
against the proxies, and frees the workers with `shutdown` when training ends.

Modes:
- `shared` (the paper's): one pool (a Ray placement group of one bundle) and one worker on it that
  holds every model. The trainer updates models one after another, so the models time-share the
  pool's devices: generate, update model by model, sync weights.
- `per_agent`: one worker per group of models that must live together (assignment per_agent /
  heterogeneous: one per agent; shared: one; lora: one with every adapter on the shared base), each
  on a disjoint pool of its own size (`pools[name]`, else `default_pool`).

A *worker* is one Ray actor holding its models with their engines and learners. After each update
it pushes the new weights into its own engine, so no weights cross the network while training;
checkpoints fetch weights and optimizer states from the workers, and a resume loads them back.

Data parallel: a pool of `ranks` > 1 bundles trains its models on every bundle. Rank 0 is the
worker above (engine, generation, checkpoints); ranks 1.. hold replicas and learners only. Every
update goes to all ranks at once, each computes its share of the micro-batches and the gradients
are summed over torch.distributed (gloo on CPUs, NCCL on GPUs; see `distributed`), so the step is
the one-process step; only rank 0 pushes the new weights into its engine. A vLLM engine cannot
live in a data-parallel process (it takes torch.distributed's default group), so rank 0's vLLM
engines run in `EngineActor`s on its bundle and receive the weights through Ray.

Ray is started locally (with at least as many logical CPUs as the pools ask for) or joined
(`ray_address`, e.g. "auto" or "ray://head:10001"), so a multi-node run needs no code change.
Pools are sized in CPUs and GPUs per rank; a rank uses its bundle's devices.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MODES = ("none", "shared", "per_agent")


@dataclass
class PoolSize:
    """Resources of one pool (one Ray placement-group bundle)."""

    cpus: float = 1.0
    """CPU cores; a worker sets torch's thread count to this (at least 1)."""
    gpus: float = 0.0
    """GPUs; a worker sees only these (Ray sets CUDA_VISIBLE_DEVICES)."""
    ranks: int = 1
    """Data-parallel ranks: the pool is `ranks` bundles of `cpus` + `gpus`, one training process each
    (e.g. 4 GPUs for one model: gpus=1, ranks=4). Rank 0 also generates."""
    strategy: str = "replicate"
    """With ranks > 1: replicate (a full copy per rank, gradients all-reduced: fastest when the training
    state fits a device) or fsdp (weights, gradients and AdamW state sharded over the ranks, FSDP2: the
    paper-scale choice: by arithmetic, a 4B model's 64 GB of state becomes 16 GB per GPU on 4 ranks)."""


@dataclass
class PlacementConfig:
    """Where the models run."""

    mode: str = "none"
    """none (this process, the default), shared (one pool for every model), per_agent (a pool per worker)."""
    ray_address: str | None = None
    """Join this Ray cluster ("auto", "ray://host:10001"); None starts a local Ray."""
    shared_pool: PoolSize = field(default_factory=PoolSize)
    """The pool of `shared` mode."""
    default_pool: PoolSize = field(default_factory=PoolSize)
    """The pool of a `per_agent` worker that `pools` does not name."""
    pools: dict[str, PoolSize] = field(default_factory=dict)
    """Per-worker pool sizes in `per_agent` mode, by worker name (an agent name, or "shared" / "lora")."""
    ready_timeout_s: float = 600.0
    """How long to wait for the cluster to grant the pools before failing with a clear error."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"placement.mode must be one of {MODES}, got {self.mode!r}")
        for name, size in {"shared_pool": self.shared_pool, "default_pool": self.default_pool, **self.pools}.items():
            if size.cpus <= 0 or size.gpus < 0 or size.ranks < 1:
                raise ValueError(f"placement pool {name!r} needs cpus > 0, gpus >= 0 and ranks >= 1, got {size}")
            if size.strategy not in ("replicate", "fsdp"):
                raise ValueError(f"placement pool {name!r}: strategy must be replicate or fsdp, got {size.strategy!r}")


def worker_groups(assignment: str, agents: Sequence[str]) -> dict[str, list[str]]:
    """Which agents each worker serves: the models that must live in one process."""
    if assignment in ("per_agent", "heterogeneous"):
        return {a: [a] for a in agents}
    if assignment in ("shared", "lora"):
        return {assignment: list(agents)}
    raise ValueError(f"unknown assignment {assignment!r}")


# ---- the worker (runs inside a Ray actor) --------------------------------------------------------
class PolicyWorker:
    """One worker: builds its policies and learners from the training config, and serves them."""

    def __init__(
        self,
        cfg: Any,
        agents: Sequence[str],
        lora_ranks: dict[str, int],
        threads: int,
        rank: int = 0,
        strategy: str = "replicate",
        world_size: int = 1,
        engine_gpus: float = 0.0,
    ):
        import dataclasses

        import torch

        from drmas_train.models.assignment import build_policies
        from drmas_train.policy_ops import make_learner, seed_everything

        torch.set_num_threads(max(1, threads))
        self.cfg, self.rank = cfg, rank
        self.sharded = strategy == "fsdp" and world_size > 1
        models = cfg.models
        engine_actors = models.backend == "vllm" and world_size > 1 and rank == 0
        if rank > 0 or engine_actors:  # the transformers wrapper shares its module and costs nothing
            models = dataclasses.replace(models, backend="transformers")
        seed_everything(cfg.seed)  # as the single-process trainer does before it builds its policies
        self.policies = build_policies(models, list(agents), seed=cfg.seed, lora_ranks=lora_ranks)
        if engine_actors:
            # vLLM in this process would take torch.distributed's default group (a world of one),
            # which the data-parallel group needs: its engines run in actors of their own.
            _move_vllm_engines_to_actors(self.policies, cfg.models, lora_ranks, engine_gpus)
        if self.sharded:
            # FSDP replaces the parameters by shards, so the learners are built after sharding
            # (`join_data_parallel`), and rank 0's engine must not share the module it trains.
            self.learners = {}
            if rank == 0:
                _give_engines_their_own_copy(self.policies, models.max_gen_batch)
        else:
            self.learners = {name: make_learner(cfg, p) for name, p in self.policies.items()}
        for name in self.policies:
            self._sync(name, collective=False)

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0: the address and free port where the other ranks join the data-parallel group."""
        from drmas_train.distributed import rendezvous_address

        return rendezvous_address()

    def join_data_parallel(self, host: str, port: int, world_size: int, timeout_s: float, strategy: str) -> None:
        """Join the data-parallel group; every replica (or shard) then starts from rank 0's weights."""
        from drmas_train.distributed import join, shard_module
        from drmas_train.policy_ops import make_learner

        dp = join(self.rank, world_size, host, port, timeout_s=timeout_s, strategy=strategy)
        modules = {id(p.module): p.module for p in self.policies.values()}
        for module in modules.values():
            if dp.sharded:
                shard_module(module, dp)
            else:
                dp.broadcast_module(module)
        if dp.sharded:
            self.learners = {name: make_learner(self.cfg, p, dp=dp) for name, p in self.policies.items()}
        for learner in self.learners.values():
            learner.dp = dp

    def _sync(self, name: str, *, collective: bool = True) -> None:
        """Push policy `name`'s weights into rank 0's engine; under FSDP every rank gathers them first."""
        from drmas_train.distributed import full_state_dict
        from drmas_train.policy_ops import sync_engine

        policy = self.policies[name]
        if self.sharded and collective:
            whole = full_state_dict(policy.module)
            if self.rank == 0:
                sync_engine(policy, whole)
        elif self.rank == 0:
            sync_engine(policy)

    def describe(self) -> dict[str, Any]:
        """Per policy: its agents, adapter and model folder (for the driver's proxies)."""
        return {n: {"agents": p.agents, "adapter": p.adapter, "path": str(p.path)} for n, p in self.policies.items()}

    def generate(self, name: str, prompts, sampling, adapters, seed):
        return self.policies[name].backend.generate(prompts, sampling, adapters=adapters, seed=seed)

    def update(self, name: str, records) -> dict[str, float]:
        """Train policy `name` on its records, then push the new weights into the worker's engine."""
        metrics = self.learners[name].update(records)
        self._sync(name)
        return metrics

    def weights(self, name: str) -> dict[str, Any]:
        """The policy's checkpoint tensors on the CPU (under FSDP a collective: every rank gathers)."""
        from drmas_train.distributed import full_state_dict

        policy = self.policies[name]
        if not self.sharded:
            return {k: v.detach().cpu() for k, v in policy.weights().items()}
        whole = full_state_dict(policy.module)
        return whole if policy.adapter is None else {n: whole[n] for n, _ in policy.trainable()}

    def load_weights(self, name: str, tensors: dict[str, Any]) -> None:
        """Load checkpointed weights (every rank is given the same whole tensors), then sync the engine."""
        from drmas_train.distributed import load_full_state_dict
        from drmas_train.policy_ops import load_policy_weights

        policy = self.policies[name]
        if self.sharded:
            load_full_state_dict(policy.module, tensors, strict=policy.adapter is None)
        else:
            load_policy_weights(policy, tensors)
        self._sync(name)

    def learner_state(self, name: str) -> dict[str, Any]:
        return self.learners[name].state_dict()

    def load_learner_state(self, name: str, state: dict[str, Any]) -> None:
        self.learners[name].load_state_dict(state)


# ---- driver-side proxies --------------------------------------------------------------------------
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


# ---- building -------------------------------------------------------------------------------------
def start_ray(placement: PlacementConfig, sizes: dict[str, PoolSize] | None = None) -> bool:
    """Join `ray_address`, or start a local Ray with enough logical CPUs for the pools `sizes`.

    Returns:
        True when this call started (or joined) Ray, False when Ray was already up in this process.

    """
    import ray

    if ray.is_initialized():
        return False
    if placement.ray_address:
        ray.init(address=placement.ray_address)
        return True
    # Logical CPUs: pools bigger than the machine still get scheduled (and share its cores).
    wanted = math.ceil(sum(p.cpus for p in (sizes or {}).values()))
    ray.init(num_cpus=max(os.cpu_count() or 1, wanted), include_dashboard=False, log_to_driver=False)
    return True


def placed_workers(placement: PlacementConfig, assignment: str, agents: Sequence[str]) -> dict[str, list[str]]:
    """The workers to start and the agents each serves: one for every model in shared mode."""
    if placement.mode == "shared":
        return {"shared": list(agents)}
    return worker_groups(assignment, agents)


def pool_sizes(placement: PlacementConfig, assignment: str, agents: Sequence[str]) -> dict[str, PoolSize]:
    """The pools to create, by worker name (one pool per worker)."""
    if placement.mode == "shared":
        return {"shared": placement.shared_pool}
    names = list(worker_groups(assignment, agents))
    unknown = set(placement.pools) - set(names)
    if unknown:
        raise ValueError(f"placement.pools names unknown workers {sorted(unknown)}; workers: {list(names)}")
    return {n: placement.pools.get(n, placement.default_pool) for n in names}


def build_placed(
    cfg: Any,
    agents: Sequence[str],
    placement: PlacementConfig,
    lora_ranks: dict[str, int] | None = None,
    *,
    handles: list[Any] | None = None,
):
    """Start the workers on their pools; return (policies, learners, handles) for the trainer.

    Args:
        cfg: the `TrainConfig` (pickled to every worker).
        agents: the env's agents, in order.
        placement: where the workers go.
        lora_ranks: per-agent LoRA ranks.
        handles: a list to append Ray handles to as they are made, so a caller can free them if
            building fails half-way.

    Returns:
        `policies` (name -> RemotePolicy), `learners` (name -> RemoteLearner) and the list of Ray
        handles (actors and placement groups) to keep alive; `shutdown(handles)` frees them.

    Raises:
        TimeoutError: the cluster did not grant the pools within `placement.ready_timeout_s`.

    """
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    from transformers import AutoTokenizer

    if placement.mode == "none":
        raise ValueError("build_placed needs placement.mode shared or per_agent")
    groups = placed_workers(placement, cfg.models.assignment, agents)
    sizes = pool_sizes(placement, cfg.models.assignment, agents)
    start_ray(placement, sizes)
    handles = [] if handles is None else handles
    pgs = {}
    for pool, size in sizes.items():
        bundle = {"CPU": size.cpus, **({"GPU": size.gpus} if size.gpus else {})}
        pgs[pool] = placement_group([bundle] * size.ranks, strategy="PACK")
        handles.append(pgs[pool])
    try:
        ray.get([pg.ready() for pg in pgs.values()], timeout=placement.ready_timeout_s)
    except ray.exceptions.GetTimeoutError:
        asked = {pool: _describe(size) for pool, size in sizes.items()}
        raise TimeoutError(
            f"Ray did not grant the pools {asked} within {placement.ready_timeout_s:.0f} s; "
            f"the cluster has {ray.cluster_resources()}"
        ) from None
    actor_cls = ray.remote(PolicyWorker)
    policies, learners = {}, {}
    ranks: dict[str, list[Any]] = {}
    for wname, wagents in groups.items():
        size = sizes[wname]
        ranks[wname] = []
        engine_actors = cfg.models.backend == "vllm" and size.ranks > 1
        for rank in range(size.ranks):
            # rank 0 of a data-parallel vLLM pool shares its bundle's GPUs with its engine actors
            gpus = size.gpus / 2 if engine_actors and rank == 0 else size.gpus
            worker = actor_cls.options(
                num_cpus=size.cpus,
                num_gpus=gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pgs[wname], placement_group_bundle_index=rank),
            ).remote(
                cfg,
                wagents,
                dict(lora_ranks or {}),
                int(cfg.threads or max(1, size.cpus)),
                rank,
                size.strategy,
                size.ranks,
                size.gpus - gpus,
            )
            handles.append(worker)
            ranks[wname].append(worker)
    # The workers build their models at the same time; wait for all of them only now.
    workers = [r[0] for r in ranks.values()]
    described = ray.get([w.describe.remote() for w in workers])
    _join_data_parallel(ranks, sizes, placement.ready_timeout_s)
    for (wname, group), infos in zip(ranks.items(), described):
        worker = group[0]
        sharded = sizes[wname].strategy == "fsdp" and len(group) > 1
        for pname, info in infos.items():
            tokenizer = AutoTokenizer.from_pretrained(info["path"])
            if tokenizer.pad_token_id is None:
                tokenizer.pad_token = tokenizer.eos_token
            policies[pname] = RemotePolicy(
                pname,
                tokenizer,
                RemoteBackend(worker, pname, tokenizer),
                info["agents"],
                worker,
                ranks=group,
                sharded=sharded,
                adapter=info["adapter"],
                path=info["path"],
            )
            learners[pname] = RemoteLearner(group, pname, sharded=sharded)
    return policies, learners, handles


def _join_data_parallel(ranks: dict[str, list[Any]], sizes: dict[str, PoolSize], timeout_s: float) -> None:
    """Form one torch.distributed group per worker with several ranks, at its rank 0's address."""
    import ray

    pending = []
    for wname, group in ranks.items():
        if len(group) > 1:
            host, port = ray.get(group[0].rendezvous.remote())
            strategy = sizes[wname].strategy
            pending += [w.join_data_parallel.remote(host, port, len(group), timeout_s, strategy) for w in group]
    ray.get(pending)


class EngineActor:
    """A vLLM engine in an actor of its own, beside a data-parallel rank 0 (see `ActorBackend`)."""

    def __init__(self, models_cfg: Any, path: str, lora_rank: int | None):
        from transformers import AutoTokenizer

        from drmas_train.models.assignment import make_backend

        tokenizer = AutoTokenizer.from_pretrained(path)
        self.backend = make_backend("vllm", None, tokenizer, Path(path), models_cfg, lora_rank=lora_rank)

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.backend, method)(*args, **kwargs)


class ActorBackend:
    """The `Backend` of an engine living in an `EngineActor`: calls go through Ray, tensors by value."""

    def __init__(self, actor: Any, tokenizer: Any):
        self.actor, self.tokenizer = actor, tokenizer

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        import ray

        return ray.get(self.actor.call.remote(method, *args, **kwargs))

    def generate(self, prompts, sampling, *, adapters=None, seed=None):
        return self._call("generate", list(prompts), list(sampling), adapters=adapters, seed=seed)

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        self._call("load_weights", [(n, t.detach().cpu()) for n, t in named_tensors])

    def load_adapter_tensors(self, name: str, named_tensors: Iterable[tuple[str, Any]], peft_config: dict) -> None:
        self._call("load_adapter_tensors", name, [(n, t.detach().cpu()) for n, t in named_tensors], peft_config)


def _move_vllm_engines_to_actors(
    policies: dict[str, Any], models_cfg: Any, lora_ranks: dict[str, int], gpus: float
) -> None:
    """Give each module of this worker a vLLM engine in an `EngineActor` on this worker's bundle.

    The engines share `gpus` (the part of the bundle's GPUs the worker left them) equally.
    """
    import ray
    from ray.util import get_current_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = get_current_placement_group()
    strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0) if pg is not None else None
    gpus /= len({id(p.module) for p in policies.values()})
    engines: dict[int, ActorBackend] = {}
    for policy in policies.values():
        if id(policy.module) not in engines:
            rank = max([models_cfg.lora_rank, *lora_ranks.values()]) if policy.adapter is not None else None
            actor = ray.remote(EngineActor).options(num_cpus=0, num_gpus=gpus, scheduling_strategy=strategy)
            engines[id(policy.module)] = ActorBackend(
                actor.remote(models_cfg, str(policy.path), rank), policy.tokenizer
            )
        policy.backend = engines[id(policy.module)]


def _give_engines_their_own_copy(policies: dict[str, Any], max_batch_size: int) -> None:
    """Give transformers engines that share the trained module a copy of it (FSDP will shard the module)."""
    import copy

    from drmas_train.backends.transformers_backend import TransformersBackend

    engines: dict[int, TransformersBackend] = {}
    for policy in policies.values():
        backend = policy.backend
        if isinstance(backend, TransformersBackend) and backend.model is policy.module:
            if id(policy.module) not in engines:
                engines[id(policy.module)] = TransformersBackend(
                    copy.deepcopy(policy.module).eval(), policy.tokenizer, max_batch_size=max_batch_size
                )
            policy.backend = engines[id(policy.module)]


def shutdown(handles: Iterable[Any]) -> None:
    """Kill the workers and remove the placement groups."""
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    for h in handles:
        if isinstance(h, PlacementGroup):
            remove_placement_group(h)
        else:
            ray.kill(h)


def _describe(size: PoolSize) -> str:
    return f"{size.cpus:g} CPU" + (f" + {size.gpus:g} GPU" if size.gpus else "")
