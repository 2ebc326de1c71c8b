"""Engines beside a data-parallel rank 0: vLLM in actors of their own, transformers on a copy."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from drmas_train.config import ModelsConfig


class EngineActor:
    """A vLLM engine in an actor of its own, beside a data-parallel rank 0 (see `ActorBackend`)."""

    def __init__(self, models_cfg: ModelsConfig, path: str, lora_rank: int | None):
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
        """Call the engine; if its actor died, raise `WorkerDiedError` (the driver adds which worker's)."""
        import ray

        from drmas_train.placement.failures import WorkerDiedError, is_death

        try:
            return ray.get(self.actor.call.remote(method, *args, **kwargs))
        except Exception as exc:
            if is_death(exc):
                raise WorkerDiedError("the vLLM engine actor", "engine", "", method) from exc
            raise

    def generate(self, prompts, sampling, *, adapters=None, seed=None):
        return self._call("generate", list(prompts), list(sampling), adapters=adapters, seed=seed)

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        self._call("load_weights", [(n, t.detach().cpu()) for n, t in named_tensors])

    def load_adapter_tensors(self, name: str, named_tensors: Iterable[tuple[str, Any]], peft_config: dict) -> None:
        self._call("load_adapter_tensors", name, [(n, t.detach().cpu()) for n, t in named_tensors], peft_config)


def move_vllm_engines_to_actors(
    policies: dict[str, Any], models_cfg: ModelsConfig, lora_ranks: dict[str, int], gpus: float
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


def give_engines_their_own_copy(policies: dict[str, Any], max_batch_size: int) -> None:
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
