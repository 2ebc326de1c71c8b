"""What the trainer and a Ray placement worker both do with a policy: seed, build its learner, sync, load.

Module-level so that `placement.PolicyWorker` builds learners and syncs engines exactly as the
single-process `Trainer` does, without a trainer of its own.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from drmas_train.algorithm.records import CallRecord
from drmas_train.config import PPOConfig, TrainConfig
from drmas_train.engines.assignment import Policy
from drmas_train.learner import Learner
from drmas_train.learner.layout import pad_step, world_size_of


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_learner(cfg: TrainConfig, policy: Policy, *, dp: Any = None) -> Learner:
    """The learner of one policy; per-agent lr / micro-batch overrides apply to the agent's own policy.

    Args:
        cfg: the `TrainConfig` (its `learner` section and `agent(name)` overrides are read).
        policy: the policy to train; its trainable parameters get `requires_grad`.
        dp: the data-parallel group (`distributed.DataParallel`) when the model trains on several ranks.

    Raises:
        ValueError: agents that share one policy ask for different lr / micro-batch sizes.

    """
    config = learner_config(cfg, policy.name, policy.agents)
    params = [p for _, p in policy.trainable()]
    for p in params:
        p.requires_grad_(True)
    return Learner(
        policy.module,
        config,
        name=policy.name,
        param_groups=[{"params": params}],
        pad_token_id=policy.tokenizer.pad_token_id,
        dp=dp,
    )


def learner_config(cfg: TrainConfig, name: str, agents: Sequence[str]) -> PPOConfig:
    """The `learner` section with the per-agent lr / micro-batch overrides of policy `name`'s agents."""
    changes = {}
    for knob in ("lr", "micro_batch_size"):
        values = {getattr(cfg.agent(a), knob) for a in agents} - {None}
        if len(values) > 1 or (values and len(agents) > 1):
            raise ValueError(
                f"agents {list(agents)} share policy {name!r}, so they cannot have their own {knob}; "
                "use assignment per_agent or lora"
            )
        if values:
            changes[knob] = values.pop()
    return dataclasses.replace(cfg.learner, **changes)


def train_records(
    cfg: TrainConfig, records: Sequence[CallRecord], policies: Mapping[str, Any], learners: Mapping[str, Any], step: int
) -> list[CallRecord]:
    """What step `step` computes advantages for and trains: the records, each `batch_layout: reference`
    model's padded with copies (`layout.pad_step`) drawn from a generator seeded by (`cfg.seed`, `step`).
    """
    configs = {name: learner_config(cfg, name, policies[name].agents) for name in learners}
    worlds = {name: world_size_of(learner) for name, learner in learners.items()}
    return pad_step(records, configs, worlds, np.random.default_rng([cfg.seed, step]))


def sync_engine(policy: Policy, whole: dict[str, torch.Tensor] | None = None) -> None:
    """Push the policy's weights (or its LoRA adapter) into its generation engine.

    Args:
        policy: the policy whose engine to refresh.
        whole: the module's state gathered whole (`distributed.full_state_dict`), for a sharded
            (FSDP) module whose own parameters are shards; None pushes the module's parameters.

    """
    backend = policy.backend
    if whole is not None:
        if policy.adapter is not None and hasattr(backend, "load_adapter_tensors"):
            raise ValueError("LoRA adapters on a vLLM engine are not supported under FSDP; use strategy replicate")
        backend.load_weights((name, whole[name]) for name, _ in policy.trainable())
        return
    if policy.adapter is not None and hasattr(backend, "load_adapter_tensors"):
        from peft import get_peft_model_state_dict

        tensors = get_peft_model_state_dict(policy.module, adapter_name=policy.adapter)
        config = policy.module.peft_config[policy.adapter].to_dict()
        backend.load_adapter_tensors(policy.adapter, tensors.items(), config)
    else:
        backend.load_weights(policy.trainable())


def load_policy_weights(policy: Policy, tensors: dict[str, torch.Tensor]) -> None:
    """Load what `Policy.weights` saved back into the policy's module (the engine is not synced)."""
    if policy.adapter is None:
        policy.module.load_state_dict(tensors)
        return
    params = dict(policy.module.named_parameters())
    with torch.no_grad():
        for name, t in tensors.items():
            params[name].copy_(t)
