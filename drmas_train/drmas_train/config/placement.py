"""`PlacementConfig`: where the models run (this process, or Ray pools), and each pool's resources."""

from __future__ import annotations

from dataclasses import dataclass, field

from drmas_train.config.choices import GpuKind, PlacementMode, PoolStrategy, RolloutRanks, check_choices


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
    strategy: PoolStrategy = "replicate"
    """With ranks > 1: replicate (a full copy per rank, gradients all-reduced: fastest when the training
    state fits a device) or fsdp (weights, gradients and AdamW state sharded over the ranks, FSDP2: the
    paper-scale choice: by arithmetic, a 4B model's 64 GB of state becomes 16 GB per GPU on 4 ranks)."""

    def __post_init__(self) -> None:
        check_choices(self, "placement pool")


@dataclass
class PlacementConfig:
    """Where the models run."""

    mode: PlacementMode = "none"
    """none (this process, the default), shared (one pool for every model), per_agent (a pool per worker)."""
    ray_address: str | None = None
    """Join this Ray cluster ("auto", "ray://host:10001"); None starts a local Ray that listens on 127.0.0.1 only."""
    shared_pool: PoolSize = field(default_factory=PoolSize)
    """The pool of `shared` mode."""
    default_pool: PoolSize = field(default_factory=PoolSize)
    """The pool of a `per_agent` worker that `pools` does not name."""
    pools: dict[str, PoolSize] = field(default_factory=dict)
    """Per-worker pool sizes in `per_agent` mode, by worker name (an agent name, or "shared" / "lora")."""
    ready_timeout_s: float = 600.0
    """How long to wait for the cluster to grant the pools before failing with a clear error."""
    gpu_memory_gib: float = 79.6
    """Memory of one GPU in GiB: what `drmas-train plan` checks each rank's memory against (the
    reference's H100 80GB, which reports 81,559 MiB; an H200: 139.8)."""
    host_memory_gib: float = 1843.0
    """Host memory of one node in GiB: what `drmas-train plan` checks a node's host memory against (the
    offloaded optimizer state of its ranks, and the models each rank loads on the host at start-up). The
    default is an 8 x H100 DGX node's 2 TB as `free -g` reports it."""
    gpus_per_node: int = 8
    """GPUs of one node: how many pool ranks `drmas-train plan` counts on one node's host memory."""
    gpu_kind: GpuKind = "h100-sxm"
    """The GPU model: `drmas-train plan` estimates time from its datasheet bandwidth and FLOP/s and names it
    in its report. Its memory is `gpu_memory_gib`, declared apart."""
    rollout_ranks: RolloutRanks = "all"
    """Which data-parallel ranks of a pool generate: all (every rank holds an engine, samples its share of
    each rollout round and takes the new weights after each update, as verl's hybrid engine uses every
    GPU) or first (rank 0 only: one engine's memory, the other ranks wait during rollout). Per-row
    seeds make the samples the same either way."""
    rollout_pool: PoolSize | None = None
    """A pool for generation only: None (the default, the reference's colocated hybrid engine) keeps each
    model's engine with its learner; set (e.g. `--set placement.rollout_pool.cpus=1`) every engine runs in an
    actor on this pool and the learner pools only train, so with `rollout.max_staleness` >= 1 generation
    overlaps the update (AReaL's and verl's fully-async split of GPUs). `ranks` > 1: engine replicas, each
    sampling a share of every round; `rollout_ranks` does not apply and `strategy` stays replicate."""

    def __post_init__(self) -> None:
        check_choices(self, "placement")
        named = {"shared_pool": self.shared_pool, "default_pool": self.default_pool, **self.pools}
        if self.rollout_pool is not None:
            named["rollout_pool"] = self.rollout_pool
        for name, size in named.items():
            if size.cpus <= 0 or size.gpus < 0 or size.ranks < 1:
                raise ValueError(f"placement pool {name!r} needs cpus > 0, gpus >= 0 and ranks >= 1, got {size}")
        if self.rollout_pool is not None:
            if self.mode == "none":
                raise ValueError(
                    "placement.rollout_pool needs placement.mode shared or per_agent (Ray pools); "
                    "with mode none the engines live in this process"
                )
            if self.rollout_pool.strategy != "replicate":
                raise ValueError(
                    "placement.rollout_pool.strategy must be replicate: the rollout pool holds engines, "
                    f"no training state to shard, got {self.rollout_pool.strategy!r}"
                )
        if self.gpu_memory_gib <= 0:
            raise ValueError(f"placement.gpu_memory_gib must be > 0, got {self.gpu_memory_gib}")
        if self.host_memory_gib <= 0 or self.gpus_per_node < 1:
            raise ValueError("placement.host_memory_gib must be > 0 and placement.gpus_per_node >= 1")
