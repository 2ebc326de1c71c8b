"""Engines that sleep: memory held only around a model's own generation (`models.engine.sleep`).

Each generation runs as wake the weights, push the current weights, wake the KV cache, generate, sleep
(`SleepingEngine`), so on a rank whose engines take turns only one is awake at a time, and each may take
`gpu_memory_utilization` of the GPU while it runs: the reference's hybrid engine, where verl's sharding
manager resumes the rollout engine's memory before each generation, loads the actor's weights into it
and releases the memory afterwards.

- vLLM (`VLLMSleep`, mixed into `VLLMBackend`): `LLM(enable_sleep_mode=True)`, `sleep(level=2)` (weights
  and KV cache discarded: the weights are pushed at every wake anyway), `wake_up(tags=["weights"])`,
  the push, `wake_up(tags=["kv_cache"])`, as vLLM's `LLM.sleep` / `LLM.wake_up` document them. vLLM's
  sleep mode exists on CUDA and ROCm GPUs only; elsewhere (vLLM on a CPU) the engine stays resident and
  the run says so once at start-up. With LoRA adapters it stays resident too: a level-2 sleep would
  lose the frozen base weights, which no push carries.
- transformers with weights of its own (beside a sharded learner, on a rollout pool, in a test): its
  parameters move to the meta device (`free_parameters`), so their memory is really freed, and come
  back as empty tensors (`materialise_parameters`) that the push fills. One that shares the learner's
  module has nothing to free: its sleep calls are no-ops (the start-up notice says so), and the push
  into it skips the tensors it already holds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch

from drmas_train.engines.base import EngineAsleepError, Generation, SamplingParams, Seeds

log = logging.getLogger(__name__)

Weights = Iterable[tuple[str, Any]]

SHARES_LEARNER = "the transformers engine shares the learner's weights (nothing to free)"
"""Why a transformers engine without weights of its own does not sleep."""


def free_parameters(module: torch.nn.Module) -> dict[int, torch.device]:
    """Replace every parameter of `module` by one on the meta device, tied ones staying tied.

    The old tensors are freed once nothing else holds them. Returns each meta parameter's former
    device (by id), what `materialise_parameters` needs.
    """
    moved: dict[int, torch.nn.Parameter] = {}
    devices: dict[int, torch.device] = {}
    for sub in module.modules():
        for key, param in list(sub._parameters.items()):
            if param is None or param.is_meta:
                continue
            if id(param) not in moved:
                meta = torch.nn.Parameter(torch.empty_like(param, device="meta"), requires_grad=param.requires_grad)
                moved[id(param)], devices[id(meta)] = meta, param.device
            sub._parameters[key] = moved[id(param)]
    return devices


def materialise_parameters(module: torch.nn.Module, devices: dict[int, torch.device]) -> None:
    """Give every meta parameter of `module` uninitialised memory on its former device (ties kept)."""
    made: dict[int, torch.nn.Parameter] = {}
    for sub in module.modules():
        for key, param in list(sub._parameters.items()):
            if param is None or not param.is_meta or id(param) not in devices:
                continue
            if id(param) not in made:
                device = devices[id(param)]
                made[id(param)] = torch.nn.Parameter(
                    torch.empty_like(param, device=device), requires_grad=param.requires_grad
                )
            sub._parameters[key] = made[id(param)]


def resident_bytes(module: torch.nn.Module) -> int:
    """Bytes held by the parameters of `module` that are not on the meta device."""
    return sum(p.numel() * p.element_size() for p in module.parameters() if not p.is_meta)


class ModuleSleep:
    """Sleep for an engine generating with a torch module (`TransformersBackend`): frees its own parameters."""

    model: torch.nn.Module
    own_weights: bool = False
    _parked: dict[int, torch.device] | None = None  # asleep: the meta parameters' former devices
    _cache_awake: bool = True

    @property
    def resident_because(self) -> str | None:
        return None if self.own_weights else SHARES_LEARNER

    @property
    def asleep(self) -> bool:
        return self._parked is not None or not self._cache_awake

    def sleep(self) -> None:
        """Free the parameters (moved to the meta device); a no-op on the learner's module."""
        if self.own_weights and self._parked is None:
            self._parked = free_parameters(self.model)
            self._cache_awake = False  # its KV cache lives per call: nothing else to free

    def wake_weights(self) -> None:
        """Uninitialised parameters on their devices again, for the push to fill."""
        if self._parked is not None:
            materialise_parameters(self.model, self._parked)
            self._parked = None

    def wake_cache(self) -> None:
        if self._parked is not None:
            raise EngineAsleepError("wake the engine's weights (and push them) before its cache")
        self._cache_awake = True


class VLLMSleep:
    """vLLM's sleep mode for `VLLMBackend` (the module doc); `_sleep_setup` runs before the engine is built."""

    llm: Any
    resident_because: str | None = "the engine was built without models.engine.sleep"
    _awake: frozenset[str] = frozenset({"weights", "kv_cache"})

    def _sleep_setup(self, wanted: bool, lora: bool) -> None:
        """Decide whether this engine sleeps: asked for, on a platform with vLLM's sleep mode, without LoRA."""
        from vllm.platforms import current_platform

        if not wanted:
            self.resident_because = "models.engine.sleep is off"
        elif not current_platform.is_sleep_mode_available():
            name = "a CPU" if current_platform.is_cpu() else f"device type {current_platform.device_type!r}"
            self.resident_because = f"vLLM on {name} has no sleep mode (CUDA and ROCm only)"
        elif lora:
            self.resident_because = "a vLLM engine with LoRA adapters keeps its frozen base weights resident"
        else:
            self.resident_because = None

    @property
    def asleep(self) -> bool:
        return self._awake != {"weights", "kv_cache"}

    def sleep(self) -> None:
        """Level 2: weights and KV cache discarded (the next wake pushes the weights)."""
        if self.resident_because is None and self._awake:
            self.llm.sleep(level=2)
            self._awake = frozenset()

    def wake_weights(self) -> None:
        if self.resident_because is None and "weights" not in self._awake:
            self.llm.wake_up(tags=["weights"])
            self._awake = self._awake | {"weights"}

    def wake_cache(self) -> None:
        if self.resident_because is not None or "kv_cache" in self._awake:
            return
        if "weights" not in self._awake:
            raise EngineAsleepError("wake the engine's weights (and push them) before its KV cache")
        self.llm.wake_up(tags=["kv_cache"])
        self._awake = self._awake | {"kv_cache"}

    def _check_awake(self, *parts: str) -> None:
        """Raise `EngineAsleepError` unless `parts` (default: everything) are awake."""
        missing = sorted(set(parts or ("weights", "kv_cache")) - self._awake)
        if missing:
            raise EngineAsleepError(
                f"the vLLM engine is asleep ({', '.join(missing)} released): wake_weights, push the "
                "weights, wake_cache, then generate (engines.sleep.SleepingEngine does this)"
            )


class SleepingEngine:
    """A `Backend` that sleeps between generations: each `generate` wakes, pushes, generates and sleeps.

    Args:
        inner: the engine (a `base.Sleeper`; its calls are no-ops where it cannot free anything).
        weights: where a wake's push comes from (the learner's current parameters); None: whoever
            wakes it passes the weights to `wake` (a sharded learner gathers them, every rank at once).

    Weights pushed while it sleeps (`load_weights`) are dropped: the next wake pushes the current ones,
    so the version a request is stamped with (`rollout.versions`) is that of the weights it sampled with.

    """

    def __init__(self, inner: Any, weights: Callable[[], Weights] | None):
        self.inner, self.weights = inner, weights
        self.tokenizer = inner.tokenizer
        self.asleep = False

    def sleep(self) -> None:
        self.inner.sleep()
        self.asleep = True

    def wake(self, weights: Weights | None = None) -> None:
        """Wake the weights, push `weights` (None: this engine's source), wake the KV cache (awake: nothing)."""
        if not self.asleep:
            return
        if weights is None:
            if self.weights is None:
                raise EngineAsleepError("this engine is woken with the weights its worker gathers; it was not")
            weights = self.weights()
        self.inner.wake_weights()
        self.inner.load_weights(weights)
        self.inner.wake_cache()
        self.asleep = False

    def generate(
        self,
        prompts: list[list[int]],
        sampling: list[SamplingParams],
        *,
        adapters: list[str | None] | None = None,
        seed: Seeds = None,
    ) -> list[Generation]:
        self.wake()
        try:
            return self.inner.generate(prompts, sampling, adapters=adapters, seed=seed)
        finally:
            self.sleep()

    def load_weights(self, named_tensors: Weights) -> None:
        """Push into an awake engine; dropped while it sleeps (its next wake pushes the current weights)."""
        if not self.asleep:
            self.inner.load_weights(named_tensors)

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)


def sleep_engines(policies: dict[str, Any], *, gathered: bool = False) -> None:
    """Put each distinct engine of `policies` to sleep behind a `SleepingEngine`, and say once which cannot.

    Args:
        policies: `Policy`s (or anything with `backend` and `module`), by name; policies that share an
            engine (LoRA adapters, a shared model) share its `SleepingEngine`.
        gathered: the learner's module is sharded, so a wake's weights come from its worker (`wake`).

    An engine that cannot sleep and holds weights of its own (vLLM on a CPU) is left as it is: resident.

    """
    wrapped: dict[int, Any] = {}
    resident: dict[str, str] = {}
    for policy in policies.values():
        engine = policy.backend
        if id(engine) not in wrapped:
            reason = getattr(engine, "resident_because", "the engine has no sleep mode")
            if reason is not None:
                resident[reason] = f"{resident[reason]}, {policy.name}" if reason in resident else policy.name
            if reason is not None and reason != SHARES_LEARNER:
                wrapped[id(engine)] = engine
            else:
                module = policy.module
                source = None if gathered else (lambda m=module: m.named_parameters())
                wrapped[id(engine)] = SleepingEngine(engine, source)
                wrapped[id(engine)].sleep()
        policy.backend = wrapped[id(engine)]
    if resident:
        said = "; ".join(f"{why} ({names})" for why, names in resident.items())
        log.warning("models.engine.sleep: these engines stay resident: %s", said)
