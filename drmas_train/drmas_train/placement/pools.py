"""Which workers a placement starts, the pool each is given, and which ranks generate."""

from __future__ import annotations

from collections.abc import Sequence

from drmas_train.config import Assignment, BackendName, PlacementConfig, PoolSize, RolloutRanks


def worker_groups(assignment: Assignment, agents: Sequence[str]) -> dict[str, list[str]]:
    """Which agents each worker serves: the models that must live in one process."""
    if assignment in ("per_agent", "heterogeneous"):
        return {a: [a] for a in agents}
    return {assignment: list(agents)}  # shared, lora: one model


def placed_workers(placement: PlacementConfig, assignment: Assignment, agents: Sequence[str]) -> dict[str, list[str]]:
    """The workers to start and the agents each serves: one for every model in shared mode."""
    if placement.mode == "shared":
        return {"shared": list(agents)}
    return worker_groups(assignment, agents)


def pool_sizes(placement: PlacementConfig, assignment: Assignment, agents: Sequence[str]) -> dict[str, PoolSize]:
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


def uses_engine_actors(backend: BackendName, ranks: int, rank: int = 0, rollout_ranks: RolloutRanks = "all") -> bool:
    """Whether rank `rank` of a pool of `ranks` runs its engines in `EngineActor`s.

    An in-process vLLM engine takes torch.distributed's default group (a world of one), which a
    data-parallel group needs; so a generating rank of a data-parallel vLLM pool puts its engines
    beside it.
    """
    return backend == "vllm" and ranks > 1 and generates(rank, rollout_ranks)
