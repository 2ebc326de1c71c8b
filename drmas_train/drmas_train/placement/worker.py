"""The worker: one Ray actor that builds its policies and learners and serves them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from drmas_train.config import PoolStrategy, RolloutRanks, TrainConfig
from drmas_train.placement.engines import (
    engines_from_folders,
    give_engines_their_own_copy,
    move_vllm_engines_to_actors,
)
from drmas_train.placement.pools import generates, uses_engine_actors


class PolicyWorker:
    """One worker: builds its policies and learners from the training config, and serves them."""

    def __init__(
        self,
        cfg: TrainConfig,
        agents: Sequence[str],
        lora_ranks: dict[str, int],
        threads: int,
        rank: int = 0,
        strategy: PoolStrategy = "replicate",
        world_size: int = 1,
        engine_gpus: float = 0.0,
        rollout_ranks: RolloutRanks = "all",
        pooled: bool = False,
    ):
        import dataclasses

        import torch

        from drmas_train.engines.assignment import build_policies
        from drmas_train.learner.policy_ops import make_learner, seed_everything

        torch.set_num_threads(max(1, threads))
        if cfg.keep_freed_memory:  # the actor's process is the run's own
            from drmas_train.learner.allocator import keep_freed_memory

            keep_freed_memory()
        self.cfg, self.rank = cfg, rank
        self.sharded = strategy == "fsdp" and world_size > 1
        # whole models under FSDP are built empty and each rank reads its own shards (`learner.shard_load`)
        self.shard_wise = self.sharded and cfg.models.assignment != "lora"
        self.lora_ranks, self.engine_gpus = lora_ranks, engine_gpus
        # pooled: the engines live on the rollout pool (`placement.rollout_pool`); rank 0 pushes into them
        self.generates = generates(rank, rollout_ranks) and not pooled
        self.pool_engines = False
        self.rows_generated = 0
        self.versions: dict[str, int] = {}  # policy -> weight version (steps trained) its engine holds
        self.sleeps = cfg.models.engine.sleep
        """Engines sleep between generations: the driver wakes them with the current weights (`wake`)."""
        models = cfg.models
        engine_actors = uses_engine_actors(models.backend, world_size, rank, rollout_ranks) and not pooled
        self.engine_actors = engine_actors
        if not self.generates or engine_actors:  # the transformers wrapper shares its module and costs nothing
            models = dataclasses.replace(models, backend="transformers")
        seed_everything(cfg.seed)  # as the single-process trainer does before it builds its policies
        self.policies = build_policies(
            models, list(agents), seed=cfg.seed, lora_ranks=lora_ranks, empty=self.shard_wise
        )
        if self.shard_wise:  # the engines start once the shards exist (`join_data_parallel`)
            self.learners = {}
            return
        if engine_actors:
            move_vllm_engines_to_actors(self.policies, cfg.models, lora_ranks, engine_gpus)
        if self.sharded:
            # FSDP replaces the parameters by shards, so the learners are built after sharding
            # (`join_data_parallel`), and an engine must not share the module it trains.
            self.learners = {}
            if self.generates:
                give_engines_their_own_copy(self.policies, models.max_gen_batch)
        else:
            self.learners = {name: make_learner(cfg, p) for name, p in self.policies.items()}
        self._sleep_engines()
        for name in self.policies:
            self._sync(name, collective=False)

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0: the address and free port where the other ranks join the data-parallel group."""
        from drmas_train.learner.distributed import rendezvous_address

        return rendezvous_address()

    def join_data_parallel(
        self, host: str, port: int, world_size: int, timeout_s: float, strategy: PoolStrategy
    ) -> None:
        """Join the data-parallel group; every replica (or shard) then starts from rank 0's weights.

        A model built empty is sharded first and each rank reads its own shards from the model folder;
        only then are its engines started, from the same folder (so they hold the same weights).
        """
        from drmas_train.engines.assignment import pick_device
        from drmas_train.learner.distributed import join, shard_module
        from drmas_train.learner.policy_ops import make_learner
        from drmas_train.learner.shard_load import load_sharded

        dp = join(self.rank, world_size, host, port, timeout_s=timeout_s, strategy=strategy)
        modules = {id(p.module): (p.module, p.path) for p in self.policies.values()}
        for module, path in modules.values():
            if dp.sharded and self.shard_wise:
                load_sharded(module, path, dp, pick_device(self.cfg.models.device))
            elif dp.sharded:
                shard_module(module, dp)
            else:
                dp.broadcast_module(module)
        if self.shard_wise and self.engine_actors:
            move_vllm_engines_to_actors(self.policies, self.cfg.models, self.lora_ranks, self.engine_gpus)
        elif self.shard_wise and self.generates:
            engines_from_folders(self.policies, self.cfg.models)
        if self.shard_wise:
            self._sleep_engines()
        if dp.sharded:
            self.learners = {name: make_learner(self.cfg, p, dp=dp) for name, p in self.policies.items()}
        for learner in self.learners.values():
            learner.dp = dp

    def attach_engines(self, engines: dict[str, Any], kind: str) -> None:
        """Rank 0 of a pooled run: take each policy's engines on the rollout pool and push the weights into them.

        `engines`: policy -> `rollout_pool.PoolEngines`. Called before the data-parallel group forms, so
        the module is whole.
        """
        from drmas_train.placement.rollout_pool import pooled_backend

        for name, policy in self.policies.items():
            policy.backend = pooled_backend(kind, engines[name], name, policy.tokenizer, self.versions)
        self.pool_engines = True
        if self.shard_wise:  # not read yet; the engines loaded the same folder the shards will come from
            return
        for name in self.policies:
            self._sync(name, collective=False)

    def _sync(self, name: str, *, collective: bool = True) -> None:
        """Push policy `name`'s weights into this rank's engine (or its engines on the rollout pool).

        Under FSDP every rank gathers them first.
        """
        from drmas_train.learner.distributed import full_state_dict
        from drmas_train.learner.policy_ops import sync_engine

        policy = self.policies[name]
        pushes = self.generates or self.pool_engines
        if self.sleeps:  # the engine takes the weights at its next wake, gathered then
            return
        if self.sharded and collective:
            whole = full_state_dict(policy.module)  # a collective: every rank takes part, engine or not
            if pushes:
                sync_engine(policy, whole)
        elif pushes:
            sync_engine(policy)

    def _sleep_engines(self) -> None:
        """With `models.engine.sleep`, put this rank's engines to sleep behind `engines.sleep.SleepingEngine`."""
        if self.sleeps and self.generates:
            from drmas_train.engines.sleep import sleep_engines

            sleep_engines(self.policies, gathered=self.sharded)

    def wake(self, name: str) -> None:
        """Wake policy `name`'s engine with the current weights; under FSDP a collective (every rank gathers).

        An engine that stays resident (`engines.sleep.sleep_engines` left it unwrapped) is pushed the
        current weights here instead of after each update.
        """
        from drmas_train.engines.sleep import SleepingEngine
        from drmas_train.learner.distributed import full_state_dict
        from drmas_train.learner.policy_ops import sync_engine

        policy = self.policies[name]
        whole = full_state_dict(policy.module) if self.sharded else None
        if not self.generates:
            return
        if isinstance(policy.backend, SleepingEngine):
            policy.backend.wake(None if whole is None else [(n, whole[n]) for n, _ in policy.module.named_parameters()])
        else:
            sync_engine(policy, whole)

    def sleep_engine(self, name: str) -> None:
        """Put policy `name`'s engine back to sleep (a rank whose share of the round was empty never generated)."""
        from drmas_train.engines.sleep import SleepingEngine

        if self.generates and isinstance(self.policies[name].backend, SleepingEngine):
            self.policies[name].backend.sleep()

    def memory(self) -> dict[str, float]:
        """The memory peaks of this rank since the last call (`learner.memory.read_peaks`)."""
        from drmas_train.learner.memory import read_peaks

        return read_peaks()

    def pid(self) -> int:
        """The process id of this worker (named in the error raised when the process dies)."""
        import os

        return os.getpid()

    def where(self) -> dict[str, Any]:
        """The pid and placement group of this worker (as `EngineActor.where`)."""
        from drmas_train.placement.engines import actor_where

        return actor_where()

    def engine_pids(self) -> dict[str, int]:
        """Per policy this rank generates with: the pid of the process its engine runs in (`placement.engines`)."""
        from drmas_train.placement.engines import ActorBackend

        out = {}
        for name, policy in self.policies.items() if self.generates else ():
            backend = getattr(policy.backend, "inner", policy.backend)  # a SleepingEngine wraps it
            out[name] = backend.pid() if isinstance(backend, ActorBackend) else self.pid()
        return out

    def describe(self) -> dict[str, Any]:
        """Per policy: its agents, adapter and model folder (for the driver's proxies)."""
        return {n: {"agents": p.agents, "adapter": p.adapter, "path": str(p.path)} for n, p in self.policies.items()}

    def generate(self, name: str, prompts, sampling, adapters, seed):
        """Sample this rank's share of a rollout round with policy `name`'s engine, stamped with its weight version."""
        if not self.generates:
            raise RuntimeError(f"rank {self.rank} holds no engine (placement.rollout_ranks: first)")
        self.rows_generated += len(prompts)
        gens = self.policies[name].backend.generate(prompts, sampling, adapters=adapters, seed=seed)
        for gen in gens:  # this actor runs one call at a time: no push can land inside this request
            gen.version = self.versions.get(name, 0)
        return gens

    def set_version(self, name: str, version: int) -> None:
        """The weight version policy `name`'s engine holds (after a resume: the checkpoint's step)."""
        self.versions[name] = version
        if self.pool_engines:
            self.policies[name].backend.set_version(version)

    def generated(self) -> int:
        """How many prompts this rank has sampled since it started (what tests and logs check)."""
        return self.rows_generated

    def update(self, name: str, records) -> dict[str, float]:
        """Train policy `name` on its records, then push the new weights (their version: one more) into its engine."""
        metrics = self.learners[name].update(records)
        self.versions[name] = self.versions.get(name, 0) + 1  # read by a push to the rollout pool
        self._sync(name)
        return metrics

    def weights(self, name: str) -> dict[str, Any]:
        """The policy's checkpoint tensors on the CPU (under FSDP a collective: every rank gathers)."""
        from drmas_train.learner.distributed import full_state_dict

        policy = self.policies[name]
        if not self.sharded:
            return {k: v.detach().cpu() for k, v in policy.weights().items()}
        whole = full_state_dict(policy.module)
        return whole if policy.adapter is None else {n: whole[n] for n, _ in policy.trainable()}

    def load_weights(self, name: str, tensors: dict[str, Any]) -> None:
        """Load checkpointed weights (every rank is given the same whole tensors), then sync the engine."""
        from drmas_train.learner.distributed import load_full_state_dict
        from drmas_train.learner.policy_ops import load_policy_weights

        policy = self.policies[name]
        if self.sharded:
            load_full_state_dict(policy.module, tensors, strict=policy.adapter is None)
        else:
            load_policy_weights(policy, tensors)
        self._sync(name)

    def shard_bytes(self, name: str) -> int:
        """About the bytes this rank's shard of policy `name` takes in a checkpoint."""
        from drmas_train.learner.policy_shards import local_bytes

        return local_bytes(self.policies[name], self.learners[name], sharded=self.sharded)

    def save_shard(self, name: str, folder: str) -> int:
        """Write this rank's shard of policy `name` into the checkpoint folder `folder` (under FSDP nothing is
        gathered: its own parameter and optimizer shards); the bytes written.
        """
        from pathlib import Path

        from drmas_train.learner.policy_shards import write_policy

        policy, learner = self.policies[name], self.learners[name]
        return write_policy(Path(folder), name, policy, learner, rank=self.rank, sharded=self.sharded)

    def load_shard(self, name: str, folder: str) -> None:
        """Read this rank's part of policy `name` from a sharded checkpoint (any rank count wrote it), then sync."""
        from pathlib import Path

        from drmas_train.learner.policy_ops import load_policy_weights
        from drmas_train.learner.policy_shards import read_policy

        policy, learner = self.policies[name], self.learners[name]
        weights, state = read_policy(Path(folder), name, policy, learner)
        if self.sharded:
            policy.module.load_state_dict(weights, strict=policy.adapter is None)
        else:
            load_policy_weights(policy, weights)
        learner.load_state_dict(state)
        self._sync(name)

    def learner_state(self, name: str) -> dict[str, Any]:
        return self.learners[name].state_dict()

    def load_learner_state(self, name: str, state: dict[str, Any]) -> None:
        self.learners[name].load_state_dict(state)
