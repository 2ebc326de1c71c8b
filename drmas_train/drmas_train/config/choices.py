"""The closed sets of values some config fields take, each declared once as a `Literal` type.

A field annotated with one of these types is checked when the config is built (`from_dict` and every
section's `__post_init__`), and the CLI's `choices=` and `--help-config` read their choices from the
same type (`choices`), so a value added here is accepted, offered and documented everywhere at once.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

Estimator = Literal["drmas", "grpo", "pooled", "rloo"]
"""Advantage estimators (`drmas_train.algorithm.advantages.ESTIMATORS` maps each to its function)."""
Assignment = Literal["shared", "per_agent", "heterogeneous", "lora"]
"""How agents map to models."""
BackendName = Literal["auto", "transformers", "vllm"]
"""Generation engines."""
Forward = Literal["auto", "plain", "shared_prefix"]
"""How the learner runs a micro-batch's forward pass."""
OldLogprobs = Literal["recompute", "sampled", "decoupled"]
"""Where the PPO ratio's denominator comes from."""
LossAgg = Literal["token_mean", "micro_token_mean"]
"""How the per-token losses of a mini-batch become one loss."""
BatchLayout = Literal["reference", "packed"]
"""Which records share a rank, a mini-batch and a micro-batch in one update (`learner.layout`)."""
ComputeDtype = Literal["auto", "float32", "bfloat16"]
"""The dtype of the learner's matmuls (weights and optimizer state stay in `models.dtype`)."""
HeadDtype = Literal["float32", "compute"]
"""The dtype of the learner's LM-head matmul under mixed precision."""
ResidualDtype = Literal["float32", "compute"]
"""The dtype of the hidden states between the learner's decoder layers under mixed precision."""
PlacementMode = Literal["none", "shared", "per_agent"]
"""Where the models run."""
RolloutRanks = Literal["all", "first"]
"""Which data-parallel ranks of a pool generate."""
PoolStrategy = Literal["replicate", "fsdp"]
"""How a pool's data-parallel ranks hold the training state."""
GpuKind = Literal["h100-sxm", "h200", "a100-80gb"]
"""GPU models whose datasheet figures `drmas-train plan` knows."""
Truncation = Literal["middle", "left", "right", "error"]
"""Which part of an over-long prompt is cut (verl's `data.truncation`)."""


def choices(tp: Any) -> tuple[str, ...]:
    """The values of a `Literal` annotation (also inside `X | None`); () for any other type."""
    if typing.get_origin(tp) is Literal:
        return tuple(typing.get_args(tp))
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return tuple(v for arg in typing.get_args(tp) for v in choices(arg))
    return ()


def check_choices(section: Any, where: str) -> None:
    """Raise ValueError naming `where.field` for every field of `section` whose value is not one of its choices.

    Args:
        section: a config dataclass instance.
        where: its dotted path in the config, e.g. "algo", for the message.

    """
    hints = typing.get_type_hints(type(section))
    for f in dataclasses.fields(section):
        allowed = choices(hints[f.name])
        value = getattr(section, f.name)
        if allowed and value not in allowed and not (value is None and _optional(hints[f.name])):
            raise ValueError(f"{where}.{f.name} must be one of {allowed}, got {value!r}")


def _optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)
