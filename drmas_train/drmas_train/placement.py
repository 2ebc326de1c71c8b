"""Ray resource pools: run each model's engine and learner in a Ray actor, on a shared or per-model pool.

    placement = PlacementConfig(mode="per_agent", pools={"solver": PoolSize(cpus=1), "verifier": PoolSize(cpus=1)})
    attach(trainer, placement)          # the trainer's loop is unchanged; its policies now live in actors

Modes:
- `shared` (the paper's): one pool (a Ray placement group of one bundle) holds every model's worker.
  The trainer already updates models one after another, so the workers time-share the pool:
  generate, update model by model, sync weights.
- `per_agent`: each worker gets a disjoint pool of its own size (`pools[name]`, else `default_pool`).

A *worker* holds what must live together: one model with its engine and its learner (assignment
shared: one worker; per_agent / heterogeneous: one per agent; lora: one worker with every adapter on
the shared base). After each update the worker pushes the new weights into its own engine, so the
driver-side `load_weights` is a no-op and no weights cross the network.

Ray is started locally (`ray.init(num_cpus=...)`) or joined (`ray_address`, e.g. "auto" or
"ray://head:10001"), so a multi-node run needs no code change. Pools are sized in CPUs and GPUs; a
worker uses its pool's devices. Data-parallel training of one model across several devices of its
pool (torch distributed, FSDP on GPUs) is NOT implemented yet: a worker trains on one device.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
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

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"placement.mode must be one of {MODES}, got {self.mode!r}")


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

    def __init__(self, cfg: Any, agents: Sequence[str], lora_ranks: dict[str, int], threads: int):
        import torch

        from drmas_train.models.assignment import build_policies
        from drmas_train.trainer import Trainer, seed_everything

        torch.set_num_threads(max(1, threads))
        seed_everything(cfg.seed)
        self.policies = build_policies(cfg.models, list(agents), seed=cfg.seed, lora_ranks=lora_ranks)
        shim = _ConfigHolder(cfg)  # the trainer's own learner factory, so overrides apply the same way
        self.learners = {name: Trainer._learner(shim, p) for name, p in self.policies.items()}
        for p in self.policies.values():
            Trainer._sync(shim, p)

    def describe(self) -> dict[str, Any]:
        """Per policy: its agents, adapter and model folder (for the driver's proxies)."""
        return {n: {"agents": p.agents, "adapter": p.adapter, "path": str(p.path)} for n, p in self.policies.items()}

    def generate(self, name: str, prompts, sampling, adapters, seed):
        return self.policies[name].backend.generate(prompts, sampling, adapters=adapters, seed=seed)

    def update(self, name: str, records) -> dict[str, float]:
        """Train policy `name` on its records, then push the new weights into the worker's engine."""
        from drmas_train.trainer import Trainer

        metrics = self.learners[name].update(records)
        Trainer._sync(_ConfigHolder(None), self.policies[name])
        return metrics

    def weights(self, name: str) -> dict[str, Any]:
        return {k: v.detach().cpu() for k, v in self.policies[name].weights().items()}

    def load_weights(self, name: str, tensors: dict[str, Any]) -> None:
        from drmas_train.trainer import Trainer, load_policy_weights

        load_policy_weights(self.policies[name], tensors)
        Trainer._sync(_ConfigHolder(None), self.policies[name])

    def learner_state(self, name: str) -> dict[str, Any]:
        return self.learners[name].state_dict()

    def load_learner_state(self, name: str, state: dict[str, Any]) -> None:
        self.learners[name].load_state_dict(state)


@dataclass
class _ConfigHolder:
    cfg: Any


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
    adapter: str | None = None
    path: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def trainable(self) -> Iterator[tuple[str, Any]]:
        yield from self.weights().items()

    def weights(self) -> dict[str, Any]:
        import ray

        return ray.get(self.worker.weights.remote(self.name))


class RemoteLearner:
    """Stands in for `learner.Learner` on the driver."""

    def __init__(self, worker: Any, name: str):
        self.worker, self.name = worker, name

    def update(self, records) -> dict[str, float]:
        import ray

        return ray.get(self.worker.update.remote(self.name, list(records)))

    def state_dict(self) -> dict[str, Any]:
        import ray

        return ray.get(self.worker.learner_state.remote(self.name))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import ray

        ray.get(self.worker.load_learner_state.remote(self.name, state))


# ---- building -------------------------------------------------------------------------------------
def start_ray(placement: PlacementConfig) -> None:
    """Join `ray_address`, or start a local Ray sized to the pools (no-op if Ray is already up)."""
    import ray

    if ray.is_initialized():
        return
    if placement.ray_address:
        ray.init(address=placement.ray_address)
        return
    ray.init(include_dashboard=False, log_to_driver=False)


def _pool_sizes(placement: PlacementConfig, names: Sequence[str]) -> dict[str, PoolSize]:
    if placement.mode == "shared":
        return {"__shared__": placement.shared_pool}
    unknown = set(placement.pools) - set(names)
    if unknown:
        raise ValueError(f"placement.pools names unknown workers {sorted(unknown)}; workers: {list(names)}")
    return {n: placement.pools.get(n, placement.default_pool) for n in names}


def build_placed(cfg: Any, agents: Sequence[str], placement: PlacementConfig, lora_ranks: dict[str, int] | None = None):
    """Start the workers on their pools; return (policies, learners, handles) for the trainer.

    Returns:
        `policies` (name -> RemotePolicy), `learners` (name -> RemoteLearner) and a list of Ray handles
        (actors and placement groups) to keep alive; `shutdown(handles)` frees them.

    """
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    from transformers import AutoTokenizer

    if placement.mode == "none":
        raise ValueError("build_placed needs placement.mode shared or per_agent")
    start_ray(placement)
    groups = worker_groups(cfg.models.assignment, agents)
    sizes = _pool_sizes(placement, list(groups))
    pgs = {}
    for pool, size in sizes.items():
        bundle = {"CPU": size.cpus, **({"GPU": size.gpus} if size.gpus else {})}
        pgs[pool] = placement_group([bundle], strategy="PACK")
    ray.get([pg.ready() for pg in pgs.values()])
    actor_cls = ray.remote(PolicyWorker)
    policies, learners, handles = {}, {}, list(pgs.values())
    share = len(groups) if placement.mode == "shared" else 1  # workers of one shared pool split it
    for wname, wagents in groups.items():
        pool = "__shared__" if placement.mode == "shared" else wname
        size = sizes[pool]
        worker = actor_cls.options(
            num_cpus=size.cpus / share,
            num_gpus=size.gpus / share,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pgs[pool], placement_group_bundle_index=0),
        ).remote(cfg, wagents, dict(lora_ranks or {}), int(cfg.threads or max(1, size.cpus / share)))
        handles.append(worker)
        for pname, info in ray.get(worker.describe.remote()).items():
            tokenizer = AutoTokenizer.from_pretrained(info["path"])
            if tokenizer.pad_token_id is None:
                tokenizer.pad_token = tokenizer.eos_token
            policies[pname] = RemotePolicy(
                pname,
                tokenizer,
                RemoteBackend(worker, pname, tokenizer),
                info["agents"],
                worker,
                adapter=info["adapter"],
                path=info["path"],
            )
            learners[pname] = RemoteLearner(worker, pname)
    return policies, learners, handles


def attach(trainer: Any, placement: PlacementConfig) -> list[Any]:
    """Move a built trainer's policies and learners into Ray workers; return the handles to keep.

    A stop-gap hook until the trainer builds placed policies itself: the trainer's rollout, update
    loop, metrics and checkpoints stay unchanged and talk to the proxies. The trainer's local models
    are replaced (and freed) at once.
    """
    from drmas_train.models.assignment import agent_to_policy

    lora_ranks = {a: o.lora_rank for a, o in trainer.cfg.agents.items() if o.lora_rank is not None}
    policies, learners, handles = build_placed(trainer.cfg, trainer.agents, placement, lora_ranks)
    if set(policies) != set(trainer.policies):
        raise RuntimeError(f"placed policies {sorted(policies)} differ from the trainer's {sorted(trainer.policies)}")
    import ray

    # Hand the trainer's current state over (initial or resumed weights, optimizer state), so a placed
    # run continues exactly where the single-process objects stood.
    calls = []
    for name, remote in policies.items():
        calls.append(remote.worker.load_weights.remote(name, trainer.policies[name].weights()))
        calls.append(remote.worker.load_learner_state.remote(name, trainer.learners[name].state_dict()))
    ray.get(calls)
    trainer.policies, trainer.learners = policies, learners
    trainer.serving = agent_to_policy(policies)
    return handles


def shutdown(handles: Iterable[Any]) -> None:
    """Kill the workers and remove the placement groups."""
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    for h in handles:
        if isinstance(h, PlacementGroup):
            remove_placement_group(h)
        else:
            ray.kill(h)


def to_dict(placement: PlacementConfig) -> dict[str, Any]:
    """The config as plain data (for logs)."""
    return dataclasses.asdict(placement)
