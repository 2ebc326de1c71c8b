"""Starting the workers on their pools, joining their data-parallel groups, and freeing them."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

from drmas_train.config import PlacementConfig, PoolSize, TrainConfig
from drmas_train.placement.failures import gather
from drmas_train.placement.loopback import loopback_only
from drmas_train.placement.pools import generates, placed_workers, pool_sizes, uses_engine_actors
from drmas_train.placement.proxies import RemoteBackend, RemoteLearner, RemotePolicy
from drmas_train.placement.rollout_pool import ROLLOUT_POOL, check_worker_names, start_engines
from drmas_train.placement.worker import PolicyWorker


def start_ray(placement: PlacementConfig, sizes: dict[str, PoolSize] | None = None) -> bool:
    """Join `ray_address`, or start a local Ray, listening on loopback only, with enough logical CPUs for the
    pools `sizes`.

    Returns:
        True when this call started (or joined) Ray, False when Ray was already up in this process.

    """
    import ray

    if ray.is_initialized():
        return False
    if placement.ray_address:
        host = placement.ray_address.rsplit(":", 1)[0].strip("[]")
        # Ray swaps a loopback address for the machine's own before joining; a cluster on 127.0.0.1 needs it kept
        with loopback_only() if host in ("127.0.0.1", "localhost", "::1") else contextlib.nullcontext():
            ray.init(address=placement.ray_address)
        return True
    # Logical CPUs: pools bigger than the machine still get scheduled (and share its cores).
    wanted = math.ceil(sum(p.cpus for p in (sizes or {}).values()))
    with loopback_only():  # a cluster of this machine alone: its ports on 127.0.0.1 (`placement.loopback`)
        # "local": a new Ray of its own, never one RAY_ADDRESS or an earlier `ray start` on this machine names
        ray.init(
            address="local", num_cpus=max(os.cpu_count() or 1, wanted), include_dashboard=False, log_to_driver=False
        )
    return True


def build_placed(
    cfg: TrainConfig,
    agents: Sequence[str],
    placement: PlacementConfig,
    lora_ranks: dict[str, int] | None = None,
    *,
    handles: list[Any] | None = None,
):
    """Start the workers on their pools (and the engines on the rollout pool); return (policies, learners, handles).

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
        WorkerDiedError: a worker died while it built its models (`placement.failures`).

    """
    import uuid

    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from drmas_train.engines import resolve_backend
    from drmas_train.engines.assignment import load_tokenizer

    if placement.mode == "none":
        raise ValueError("build_placed needs placement.mode shared or per_agent")
    groups = placed_workers(placement, cfg.models.assignment, agents)
    sizes = pool_sizes(placement, cfg.models.assignment, agents)
    pooled = placement.rollout_pool is not None
    if pooled:
        check_worker_names(list(sizes))
        sizes[ROLLOUT_POOL] = placement.rollout_pool
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
    run_id = uuid.uuid4().hex[:8]  # actor names are unique per Ray namespace; a later run reuses none
    for wname, wagents in groups.items():
        size = sizes[wname]
        ranks[wname] = []
        for rank in range(size.ranks):
            # a rank with engine actors shares its bundle's GPUs with them, half each
            engine_actors = uses_engine_actors(cfg.models.backend, size.ranks, rank, placement.rollout_ranks)
            gpus = size.gpus / 2 if engine_actors else size.gpus
            worker = actor_cls.options(
                name=actor_name(wname, rank, run_id),
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
                placement.rollout_ranks,
                pooled,
            )
            handles.append(worker)
            ranks[wname].append(worker)
    # The workers build their models at the same time; wait for all of them only now.
    labels = _labels(ranks)
    workers = [r[0] for r in ranks.values()]
    described = ray.get([w.describe.remote() for w in workers])
    engines = {}
    if pooled:  # engines on the rollout pool; rank 0 of each learner pool pushes into its models' engines
        by_worker = dict(zip(ranks, described))
        engines = start_engines(
            cfg, sizes[ROLLOUT_POOL], pgs[ROLLOUT_POOL], by_worker, run_id, lora_ranks or {}, handles
        )
        kind = resolve_backend(cfg.models.backend)
        attach = [w.attach_engines.remote({p: engines[p] for p in by_worker[n]}, kind) for n, w in zip(ranks, workers)]
        gather(attach, [labels[n, 0] for n in ranks], "learner", "", "attach_engines")
    _join_data_parallel(ranks, sizes, placement.ready_timeout_s)
    for (wname, group), infos in zip(ranks.items(), described):
        worker = group[0]
        sharded = sizes[wname].strategy == "fsdp" and len(group) > 1
        names = [labels[wname, rank] for rank in range(len(group))]
        generating = [r for r in range(len(group)) if generates(r, placement.rollout_ranks)]
        for pname, info in infos.items():
            tokenizer = load_tokenizer(info["path"])
            if pooled:
                backend = RemoteBackend(engines[pname].actors, pname, tokenizer, engines[pname].labels)
            else:
                backend = RemoteBackend(
                    [group[r] for r in generating],
                    pname,
                    tokenizer,
                    [names[r] for r in generating],
                    wake_ranks=group if cfg.models.engine.sleep else (),
                    wake_labels=names,
                )
            policies[pname] = RemotePolicy(
                pname,
                tokenizer,
                backend,
                info["agents"],
                worker,
                ranks=group,
                sharded=sharded,
                adapter=info["adapter"],
                path=info["path"],
                labels=names,
                pool=wname,
            )
            learners[pname] = RemoteLearner(group, pname, sharded=sharded, labels=names)
    return policies, learners, handles


def _labels(ranks: dict[str, list[Any]]) -> dict[tuple[str, int], str]:
    """Each worker's name in errors, by (pool, rank): "pool 'shared' rank 1 (pid 4242)".

    Asking the pids waits for every worker to have built its models; one that died meanwhile
    raises `WorkerDiedError`.
    """
    everyone = [(pool, rank, w) for pool, group in ranks.items() for rank, w in enumerate(group)]
    where = [f"pool {pool!r} rank {rank}" for pool, rank, _ in everyone]
    pids = gather([w.pid.remote() for *_, w in everyone], where, "worker", "", "__init__")
    return {(pool, rank): f"{w} (pid {pid})" for (pool, rank, _), w, pid in zip(everyone, where, pids)}


def actor_name(pool: str, rank: int, run_id: str) -> str:
    """The Ray actor name of a worker (what `ray list actors` shows): `drmas:<pool>:rank<rank>:<run id>`."""
    return f"drmas:{pool}:rank{rank}:{run_id}"


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
