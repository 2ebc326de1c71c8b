"""Helpers of the learner: micro-batches (by LoRA adapter, by length or shared prefix), param groups, norms."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from drmas_train.algorithm.records import CallRecord
from drmas_train.learner.distributed import full_tensor


def adapter_of(record: CallRecord) -> str | None:
    """The LoRA adapter a record's call ran with (None: the model's own weights)."""
    return record.adapter


def chunk_by_adapter(
    records: Sequence[CallRecord], indices: Iterable[int], size: int, *, by_prefix: bool = False
) -> list[list[int]]:
    """Split record indices into micro-batches of at most `size`, one adapter per micro-batch.

    Within an adapter, records are sorted by length so that a micro-batch holds similar lengths
    (less padding), or with `by_prefix` by their token ids (lexicographically), so that records
    sharing a prefix (a prompt group, an agent's system prompt) fall in the same micro-batch. The
    loss does not depend on the order.
    """
    by_adapter: dict[str | None, list[int]] = {}
    for i in indices:
        by_adapter.setdefault(adapter_of(records[i]), []).append(i)
    chunks: list[list[int]] = []
    for idx in by_adapter.values():
        if by_prefix:
            idx = sorted(idx, key=lambda i: (*records[i].prompt_ids, *records[i].response_ids))
        else:
            idx = sorted(idx, key=lambda i: len(records[i].prompt_ids) + len(records[i].response_ids))
        chunks.extend(idx[j : j + size] for j in range(0, len(idx), size))
    return chunks


def lora_param_groups(
    model: torch.nn.Module, default_lr: float, lr_by_adapter: Mapping[str, float] | None = None
) -> list[dict[str, Any]]:
    """One optimizer param group per LoRA adapter of a peft model, each with its own lr.

    peft marks only the active adapter trainable; this makes every adapter's LoRA weights trainable
    so that one optimizer holds them all (the learner switches the active adapter per micro-batch).

    Args:
        model: a peft model with one adapter per agent (or any subset of agents).
        default_lr: the lr of adapters missing from `lr_by_adapter`.
        lr_by_adapter: per-adapter learning rates.

    Returns:
        Param groups with keys "name" (the adapter), "params" and "lr".

    """
    adapters = list(getattr(model, "peft_config", {}))
    if not adapters:
        raise ValueError("lora_param_groups needs a peft model with at least one adapter")
    groups = []
    for name in adapters:
        params = [p for n, p in model.named_parameters() if "lora_" in n and f".{name}." in n]
        if not params:
            raise ValueError(f"adapter {name!r} has no LoRA parameters")
        for p in params:
            p.requires_grad_(True)
        lr = (lr_by_adapter or {}).get(name, default_lr)
        groups.append({"name": name, "params": params, "lr": lr})
    return groups


def named_group_norms(param_groups: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The L2 norm of the current gradients of every param group that has a "name".

    Under FSDP (DTensor gradients) each norm is gathered whole, a collective: every rank must
    call it with the same groups, whose gradients are None on the same parameters everywhere.
    """
    out = {}
    for g in param_groups:
        if "name" not in g:
            continue
        grads = [p.grad for p in g["params"] if p.grad is not None]
        out[str(g["name"])] = float(full_tensor(torch.nn.utils.get_total_norm(grads))) if grads else 0.0
    return out
