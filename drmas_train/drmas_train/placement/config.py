"""Pool sizes and modes: which workers a placement starts and what each is given."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MODES = ("none", "shared", "per_agent")
ROLLOUT_RANKS = ("all", "first")


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
    rollout_ranks: str = "all"
    """Which data-parallel ranks of a pool generate: all (every rank holds an engine, samples its share of
    each rollout round and takes the new weights after each update, as verl's hybrid engine uses every
    GPU) or first (rank 0 only: one engine's memory, the other ranks wait during rollout). Per-row
    seeds make the samples the same either way."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"placement.mode must be one of {MODES}, got {self.mode!r}")
        if self.rollout_ranks not in ROLLOUT_RANKS:
            raise ValueError(f"placement.rollout_ranks must be one of {ROLLOUT_RANKS}, got {self.rollout_ranks!r}")
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


def generates(rank: int, rollout_ranks: str = "all") -> bool:
    """Whether data-parallel rank `rank` holds a generation engine (`PlacementConfig.rollout_ranks`)."""
    return rank == 0 or rollout_ranks == "all"


def uses_engine_actors(backend: str, ranks: int, rank: int = 0, rollout_ranks: str = "all") -> bool:
    """Whether rank `rank` of a pool of `ranks` runs its engines in `EngineActor`s.

    An in-process vLLM engine takes torch.distributed's default group (a world of one), which a
    data-parallel group needs; so a generating rank of a data-parallel vLLM pool puts its engines
    beside it.
    """
    return backend == "vllm" and ranks > 1 and generates(rank, rollout_ranks)
