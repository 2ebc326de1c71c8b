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
at a checkpoint each writing worker writes its own shards into the checkpoint's folder (no weights
cross the driver; `learner.policy_shards`), and on a resume each worker reads its part back.

Rollout pool (`rollout_pool`, default None: the engines live with their learners, the reference's
colocated hybrid engine): set, every model's engine runs in an `EngineActor` on that pool and the
workers only train; after each update a worker pushes the new weights, versioned, to its models'
engine actors through Ray, and the rollout samples from those actors directly, so with
`rollout.max_staleness` >= 1 generation overlaps the update (`rollout_pool`, docs/training.md).

Data parallel: a pool of `ranks` > 1 bundles trains its models on every bundle. Every update goes to
all ranks at once, each computes its share of the micro-batches and the gradients are summed over
torch.distributed (gloo on CPUs, NCCL on GPUs; see `distributed`), so the step is the one-process
step. Every rank also generates (`rollout_ranks: all`, the default): each holds an engine, samples a
contiguous share of every rollout round's prompts (per-row seeds: the same samples as one engine)
and pushes the new weights into its engine after each update; `rollout_ranks: first` keeps one
engine, on rank 0. Rank 0 alone writes checkpoints, except under fsdp, where every rank writes its
own shards. A vLLM engine cannot live in a data-parallel
process (it takes torch.distributed's default group), so a data-parallel rank's vLLM engines run in
`EngineActor`s on its bundle and receive the weights through Ray. On GPUs, vLLM's external-launcher
mode (one engine inside each training process, sharing its device) is the design that avoids the
actor hop; docs/gpus.md says where it stands.

Ray is started locally (with at least as many logical CPUs as the pools ask for) or joined
(`ray_address`, e.g. "auto" or "ray://head:10001"), so a multi-node run needs no code change.
Pools are sized in CPUs and GPUs per rank; a rank uses its bundle's devices.

Modules: `pools` (which workers, the pool of each; the sizes are `drmas_train.config.PlacementConfig`),
`worker` (the Ray actor), `proxies` (what the driver's loop sees), `engines` (engines in actors of their
own), `rollout_pool` (the engines of a rollout pool), `build` (start and free).
"""

from drmas_train.config import PlacementConfig, PoolSize
from drmas_train.placement.build import build_placed, shutdown, start_ray
from drmas_train.placement.engines import ActorBackend, EngineActor
from drmas_train.placement.pools import placed_workers, pool_sizes, worker_groups
from drmas_train.placement.proxies import RemoteBackend, RemoteLearner, RemotePolicy
from drmas_train.placement.rollout_pool import ROLLOUT_POOL, PooledBackend, start_engines
from drmas_train.placement.worker import PolicyWorker

__all__ = [
    "ActorBackend",
    "EngineActor",
    "PlacementConfig",
    "ROLLOUT_POOL",
    "PolicyWorker",
    "PoolSize",
    "PooledBackend",
    "RemoteBackend",
    "RemoteLearner",
    "RemotePolicy",
    "build_placed",
    "placed_workers",
    "pool_sizes",
    "shutdown",
    "start_engines",
    "start_ray",
    "worker_groups",
]
