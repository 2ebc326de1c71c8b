"""A policy's checkpoint shard on one rank: its weights and its learner's state, as `learner.shards` writes them.

Under FSDP each rank writes the local shards of its parameters and optimizer moments (nothing is
gathered), and reads back only the slices of a checkpoint that overlap its own shards, whatever rank
count wrote it. Without FSDP rank 0 writes everything whole and every rank reads everything whole.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from drmas_train.learner.shards import Range, Slicer, as_like, local_range, read_tree, write_shard


def learner_state(learner: Any, *, sharded: bool) -> dict[str, Any]:
    """The learner's state as this rank holds it: under FSDP its optimizer moments are local shards (DTensors)."""
    if not sharded:
        return learner.state_dict()
    return {"optimizer": learner.optimizer.state_dict(), "steps": learner.steps, "config": asdict(learner.config)}


def local_bytes(policy: Any, learner: Any, *, sharded: bool) -> int:
    """About the bytes this rank writes for the policy (its own shards, or everything when it writes it whole)."""

    def size(obj: Any) -> int:
        if isinstance(obj, torch.Tensor):
            local = obj.to_local() if hasattr(obj, "to_local") else obj
            return local.nelement() * local.element_size()
        if isinstance(obj, dict):
            return sum(size(v) for v in obj.values())
        if isinstance(obj, (list, tuple)):
            return sum(size(v) for v in obj)
        return 0

    return size(policy.weights()) + size(learner_state(learner, sharded=sharded))


def write_policy(folder: Path, name: str, policy: Any, learner: Any, *, rank: int, sharded: bool) -> int:
    """Write this rank's shard of policy `name` (weights and learner state) into `folder`; the bytes written.

    Rank 0 also writes the tensors that are not sharded (the optimizer's step counts, whole models
    without FSDP); under FSDP every rank must call it, without FSDP rank 0 alone.
    """
    n = write_shard(folder, f"weights-{name}", rank, policy.weights(), whole_too=rank == 0)
    return n + write_shard(
        folder, f"learner-{name}", rank, learner_state(learner, sharded=sharded), whole_too=rank == 0
    )


def read_policy(folder: Path, name: str, policy: Any, learner: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Policy `name`'s weights and learner state from a checkpoint, shaped for this rank.

    Under FSDP each tensor comes back as a DTensor holding this rank's own shard (read from the slices
    that overlap it); otherwise whole. Load them with `load_state_dict` (strict for a whole model).
    """
    current = policy.weights()

    def weight_slice(key: str, shape: list[int]) -> tuple[int, int, int] | None:
        t = current.get(key.removeprefix("/"))
        return local_range(t) if t is not None and list(t.shape) == list(shape) else None

    weights = read_tree(folder, f"weights-{name}", weight_slice)
    if not isinstance(weights, dict) or not all(isinstance(t, torch.Tensor) for t in weights.values()):
        raise ValueError(f"{folder}: the weights of {name} are not a mapping of names to tensors")
    weights = {k: as_like(v, current[k]) if k in current else v for k, v in weights.items()}
    params = [p for g in learner.optimizer.param_groups for p in g["params"]]
    state = shard_optimizer_state(read_tree(folder, f"learner-{name}", optimizer_slicer(params)), params)
    return weights, state


def optimizer_slicer(params: list[torch.Tensor], prefix: str = "optimizer/state/") -> Slicer:
    """A slicer for a learner's state: each optimizer moment shaped like its parameter is read as that parameter's
    own shard (the parameter's position is the key's next part).
    """

    def slicer(key: str, shape: list[int]) -> Range | None:
        if not key.startswith(prefix):
            return None
        p = params[int(key[len(prefix) :].split("/")[0])]
        return local_range(p) if list(p.shape) == list(shape) else None

    return slicer


def shard_optimizer_state(state: Any, params: list[torch.Tensor]) -> Any:
    """A learner state read with `optimizer_slicer`: each moment made a DTensor like its parameter."""
    opt = state["optimizer"]
    for i, entry in opt["state"].items():
        p = params[int(i)]
        for k, v in entry.items():
            if isinstance(p, DTensor) and isinstance(v, torch.Tensor) and v.dim() == p.dim() and v.dim() > 0:
                entry[k] = as_like(v, p)
    return state
