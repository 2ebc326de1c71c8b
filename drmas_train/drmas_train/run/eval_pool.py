"""Evaluation on a pool of engine replicas: `drmas-train eval --placement shared`.

The shared pool's `ranks` bundles (`placement.shared_pool`: cpus, gpus, ranks) each get one engine per
model (`placement.rollout_pool.start_engines`'s `EngineActor`s: vLLM, or a transformers module of the
model's own), built from the model folder in the engine's dtype; a checkpoint's weights are read one
model at a time (`load_model_weights`; torch files are mapped, not copied) and pushed to every replica. The
driver holds no model: every generate call of the validation is split over the replicas by rows
(`RemoteBackend`, as a data-parallel pool's rollout), and per-row seeds make each row's tokens those one
engine would sample, so the result is the one-process evaluation's. No learner, optimizer or RNG
state is built or read. A LoRA team is evaluated in one process (its adapters live in the driver's
module).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

from drmas_train.config import GenDtype, TrainConfig
from drmas_train.engines.assignment import Policy


@dataclasses.dataclass
class EnginePool:
    """The placed team: agent -> policy (its backend splits over the replicas), and what to free."""

    serving: dict[str, Policy]
    handles: list[Any]
    actors: list[Any]

    def rows_per_replica(self) -> list[int]:
        """How many prompts each engine actor sampled (rank by rank, model by model)."""
        import ray

        return ray.get([a.generated.remote() for a in self.actors])

    def close(self) -> None:
        from drmas_train.placement.build import shutdown

        shutdown(self.handles)


def engine_dtype(cfg: TrainConfig) -> GenDtype:
    """The dtype the run's engine generated in: vLLM's `gen_dtype` when set, else the module's `models.dtype`.

    A transformers engine generates with a module in `models.dtype` (the learner's, or a copy of it).
    `cfg.models` must have been resolved (`assignment.resolve_engine`).
    """
    models = cfg.models
    return models.gen_dtype if models.backend == "vllm" and models.gen_dtype else models.dtype


def start_engine_pool(cfg: TrainConfig, agents: list[str], folder: Path | None) -> EnginePool:
    """Start `placement.shared_pool.ranks` replicas of the team's engines and push the checkpoint's weights.

    Raises:
        ValueError: a placement other than shared, or a LoRA team.
        TimeoutError: the cluster did not grant the pool within `placement.ready_timeout_s`.

    """
    import ray
    from ray.util.placement_group import placement_group

    from drmas_train.engines.assignment import agent_to_policy, build_policies, resolve_engine
    from drmas_train.placement.build import start_ray
    from drmas_train.placement.proxies import RemoteBackend
    from drmas_train.placement.rollout_pool import start_engines
    from drmas_train.run.checkpoint import load_model_weights

    placement = cfg.placement
    if placement.mode != "shared":
        raise ValueError(f"eval places its engines on one shared pool: --placement shared, not {placement.mode!r}")
    if cfg.models.assignment == "lora":
        raise ValueError("a LoRA team is evaluated in one process: --placement none")
    resolve_engine(cfg.models)
    models = dataclasses.replace(cfg.models, dtype=engine_dtype(cfg))
    cfg = dataclasses.replace(cfg, models=models)
    # Names, agents, folders and tokenizers only: the modules stay on the meta device, never read.
    policies = build_policies(dataclasses.replace(models, backend="transformers"), agents, empty=True)
    size = placement.shared_pool
    start_ray(placement, {"eval": size})
    bundle = {"CPU": size.cpus, **({"GPU": size.gpus} if size.gpus else {})}
    handles: list[Any] = [placement_group([bundle] * size.ranks, strategy="PACK")]
    try:
        ray.get(handles[0].ready(), timeout=placement.ready_timeout_s)
    except ray.exceptions.GetTimeoutError:
        ray.util.remove_placement_group(handles[0])
        raise TimeoutError(f"Ray did not grant the eval pool ({bundle} x {size.ranks}) in time") from None
    described = {"eval": {n: {"agents": p.agents, "adapter": None, "path": str(p.path)} for n, p in policies.items()}}
    run_id = uuid.uuid4().hex[:8]
    engines = start_engines(cfg, size, handles[0], described, run_id, {}, handles)
    step = 0 if folder is None else int(json.loads((folder / "state.json").read_text())["step"])
    for name in policies:
        actors = engines[name].actors
        if folder is not None:  # the names an engine loads: a tied head is its embedding, pushed once
            module = policies[name].module
            known = {n for n, _ in module.named_parameters()} | {n for n, _ in module.named_buffers()}
            tensors = load_model_weights(folder, [name], mmap=True)[name]
            weights = ray.put([(n, t) for n, t in tensors.items() if n in known])
            ray.get([a.push.remote(name, step, "load_weights", weights) for a in actors])
            del weights
        policy = policies[name]
        policy.backend = RemoteBackend(actors, name, policy.tokenizer, engines[name].labels)
    actors = list({id(a): a for e in engines.values() for a in e.actors}.values())
    return EnginePool(agent_to_policy(policies), handles, actors)
