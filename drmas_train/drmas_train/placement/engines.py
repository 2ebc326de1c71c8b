"""Engines in Ray actors: vLLM beside a data-parallel rank, any engine on a rollout pool.

`EngineActor` holds one model's engine. Beside a data-parallel rank (a vLLM engine cannot live in a
data-parallel process) the rank reaches it through `ActorBackend`, and the rank's other models' engines
join that actor (`EngineActor.host`) as long as the engines in it stay resident: vLLM's sleep mode has
one memory pool per process (`CuMemAllocator` is a singleton), whose sleep and wake act on every
engine built with it, so a process holds resident engines and at most one that sleeps, the last. A
resident engine needs no process of its own, and each one spared saves the start-up of vLLM (most of
an engine's start on a CPU) and, on a GPU, a CUDA context. On a rollout pool
(`PlacementConfig.rollout_pool`, `placement.rollout_pool`) the driver's rollout calls its `generate`
and the learner worker pushes each update into it with `push`, stamped with the weight version: the
actor runs one call at a time, so a push lands between two generate requests and every row it
returns carries the version of the weights that sampled it. A transformers engine is built there from
the model folder (the learner's weights arrive with the first push).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from drmas_train.config import ModelsConfig


class EngineActor:
    """One model's generation engine in an actor of its own (see the module docstring).

    Args:
        models_cfg: the `models` section (engine settings, dtype, device).
        path: the model folder.
        lora_rank: the largest adapter rank a vLLM engine must accept (None: no LoRA).
        kind: "vllm" or "transformers".
        adapters: a transformers engine's LoRA adapters, in the learner's order (agent names).
        lora_ranks: per-agent LoRA ranks of those adapters (others get `models_cfg.lora_rank`).
        threads: torch's thread count in this actor (0: leave it).

    """

    def __init__(
        self,
        models_cfg: ModelsConfig,
        path: str,
        lora_rank: int | None,
        kind: str = "vllm",
        adapters: Sequence[str] = (),
        lora_ranks: dict[str, int] | None = None,
        threads: int = 0,
    ):
        from drmas_train.engines.assignment import load_tokenizer, make_backend

        if threads > 0:
            import torch

            torch.set_num_threads(threads)
        tokenizer = load_tokenizer(path)
        module = _load_module(models_cfg, path, adapters, lora_ranks or {}) if kind == "transformers" else None
        self.backend = make_backend(kind, module, tokenizer, Path(path), models_cfg, lora_rank=lora_rank)
        if kind == "transformers":
            self.backend.own_weights = True  # built from the folder: its sleep frees it (`engines.sleep`)
        self.hosted = [self.backend]
        """This actor's engines: the first (`backend`), then those that joined it (`host`)."""
        self.versions: dict[str, int] = {}  # policy -> weight version (steps trained) the engine holds
        self.rows = 0

    def host(self, models_cfg: ModelsConfig, path: str, lora_rank: int | None) -> int:
        """Build another model's vLLM engine in this actor; returns its index for `call`'s `engine`.

        The caller makes sure every engine already here stays resident (the module docstring says why).
        """
        from drmas_train.engines.assignment import load_tokenizer, make_backend

        backend = make_backend("vllm", None, load_tokenizer(path), Path(path), models_cfg, lora_rank=lora_rank)
        self.hosted.append(backend)
        return len(self.hosted) - 1

    def call(self, method: str, *args: Any, engine: int = 0, **kwargs: Any) -> Any:
        """Call `method` of engine number `engine` of this actor (0: the one it was built with)."""
        return getattr(self.hosted[engine], method)(*args, **kwargs)

    def generate(self, name: str, prompts, sampling, adapters, seed):
        """Sample for policy `name`, every row stamped with the version its weights hold (as `PolicyWorker`)."""
        self.rows += len(prompts)
        gens = self.backend.generate(prompts, sampling, adapters=adapters, seed=seed)
        for gen in gens:  # one call at a time: no push lands inside this request
            gen.version = self.versions.get(name, 0)
        return gens

    def push(self, name: str, version: int, method: str, *args: Any) -> None:
        """Load policy `name`'s new weights (`method`: load_weights or load_adapter_tensors), now of `version`."""
        getattr(self.backend, method)(*args)
        self.versions[name] = version

    def set_version(self, name: str, version: int) -> None:
        """The weight version policy `name`'s weights hold (after a resume: the checkpoint's step)."""
        self.versions[name] = version

    def sleep_state(self, engine: int = 0) -> tuple[str | None, bool]:
        """Engine number `engine`'s `resident_because` and `asleep` (`engines.base.Sleeper`)."""
        return self.hosted[engine].resident_because, self.hosted[engine].asleep

    def generated(self) -> int:
        """How many prompts this engine has sampled (what tests and logs check)."""
        return self.rows

    def where(self) -> dict[str, Any]:
        """The pid and placement group of this actor (`actor_where`)."""
        return actor_where()


def actor_where() -> dict[str, Any]:
    """The calling actor's pid and the id of the placement group it runs in (hex; None outside one)."""
    import os

    from ray.util import get_current_placement_group

    pg = get_current_placement_group()
    return {"pid": os.getpid(), "placement_group": None if pg is None else pg.id.hex()}


def _load_module(models_cfg: ModelsConfig, path: str, adapters: Sequence[str], lora_ranks: dict[str, int]) -> Any:
    """The transformers engine's own module: the model folder, with the learner's LoRA adapters added."""
    import torch
    from transformers import AutoModelForCausalLM

    from drmas_train.engines.assignment import _add_lora, pick_device

    dtype = getattr(torch, models_cfg.dtype)
    module = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(pick_device(models_cfg.device))
    if adapters:
        module = _add_lora(module, list(adapters), models_cfg, lora_ranks)
    return module.eval()


class ActorBackend:
    """The `Backend` of an engine living in an `EngineActor`: calls go through Ray, tensors by value."""

    def __init__(self, actor: Any, tokenizer: Any, engine: int = 0):
        self.actor, self.tokenizer, self.engine = actor, tokenizer, engine

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call the engine; if its actor died, raise `WorkerDiedError` (the driver adds which worker's)."""
        import ray

        from drmas_train.placement.failures import WorkerDiedError, is_death

        try:
            return ray.get(self.actor.call.remote(method, *args, engine=self.engine, **kwargs))
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

    def pid(self) -> int:
        """The process id of the actor the engine runs in."""
        import ray

        return ray.get(self.actor.where.remote())["pid"]

    # the engine's sleep (`engines.base.Sleeper`), in its actor
    @property
    def resident_because(self) -> str | None:
        import ray

        return ray.get(self.actor.sleep_state.remote(self.engine))[0]

    @property
    def asleep(self) -> bool:
        import ray

        return ray.get(self.actor.sleep_state.remote(self.engine))[1]

    def sleep(self) -> None:
        self._call("sleep")

    def wake_weights(self) -> None:
        self._call("wake_weights")

    def wake_cache(self) -> None:
        self._call("wake_cache")


def move_vllm_engines_to_actors(
    policies: dict[str, Any], models_cfg: ModelsConfig, lora_ranks: dict[str, int], gpus: float
) -> None:
    """Give each module of this worker a vLLM engine in an `EngineActor` on this worker's bundle.

    Engines join the first actor while the engines in it stay resident; one that sleeps closes it, and
    the next engine starts an actor of its own (the module docstring says why). Each actor asks Ray for
    an engine's share of `gpus` (the part of the bundle's GPUs the worker left the engines): Ray's GPU
    count only places actors, and an engine takes its memory by `gpu_memory_utilization` wherever it runs.
    """
    import ray
    from ray.util import get_current_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    pg = get_current_placement_group()
    strategy = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0) if pg is not None else None
    modules: dict[int, Any] = {}  # module -> the first policy that uses it
    for policy in policies.values():
        modules.setdefault(id(policy.module), policy)
    share = gpus / len(modules)
    engines: dict[int, ActorBackend] = {}
    host = None  # an actor whose engines all stay resident: the next engine joins it
    for key, policy in modules.items():
        rank = max([models_cfg.lora_rank, *lora_ranks.values()]) if policy.adapter is not None else None
        if host is not None:
            index = ray.get(host.host.remote(models_cfg, str(policy.path), rank))
            engines[key] = ActorBackend(host, policy.tokenizer, index)
        else:
            actor = ray.remote(EngineActor).options(num_cpus=0, num_gpus=share, scheduling_strategy=strategy)
            host = actor.remote(models_cfg, str(policy.path), rank)
            engines[key] = ActorBackend(host, policy.tokenizer)
        # Waits until the engine is built (and asleep) before the next one starts: vLLM checks free memory.
        if engines[key].resident_because is None:  # it sleeps: no other engine may share its process
            host = None
    for policy in policies.values():
        policy.backend = engines[id(policy.module)]


def give_engines_their_own_copy(policies: dict[str, Any], max_batch_size: int) -> None:
    """Give transformers engines that share the trained module a copy of it (FSDP will shard the module)."""
    import copy

    from drmas_train.engines.transformers_backend import TransformersBackend

    engines: dict[int, TransformersBackend] = {}
    for policy in policies.values():
        backend = policy.backend
        if isinstance(backend, TransformersBackend) and backend.model is policy.module:
            if id(policy.module) not in engines:
                copied = copy.deepcopy(policy.module).eval()
                engines[id(policy.module)] = TransformersBackend(
                    copied, policy.tokenizer, max_batch_size=max_batch_size, own_weights=True
                )
            policy.backend = engines[id(policy.module)]


def engines_from_folders(policies: dict[str, Any], models_cfg: ModelsConfig) -> None:
    """Give each module of a shard-wise loaded worker a transformers engine of its own, read from its folder.

    The learner's module holds shards only, so the engine loads the same files itself (`_load_module`):
    the weights the shards were read from, so no push is needed before the first update.
    """
    from drmas_train.engines.transformers_backend import TransformersBackend

    engines: dict[int, TransformersBackend] = {}
    for policy in policies.values():
        if id(policy.module) not in engines:
            module = _load_module(models_cfg, str(policy.path), (), {})
            engines[id(policy.module)] = TransformersBackend(
                module, policy.tokenizer, max_batch_size=models_cfg.max_gen_batch, own_weights=True
            )
        policy.backend = engines[id(policy.module)]
