"""The closed sets of values some config fields take, each declared once as a `Literal` type.

A field annotated with one of these types is checked when the config is built (`from_dict` and every
section's `__post_init__`), and the CLI's `choices=` and `--help-config` read their choices from the
same type (`choices`), so a value added here is accepted, offered and documented everywhere at once.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from typing import Annotated, Any, Literal

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
ModelDtype = Literal["float32", "bfloat16", "float16"]
"""Dtypes of the trained weights (`models.dtype`): names of `torch` dtypes, as `getattr(torch, name)` reads them."""
GenDtype = Literal["auto", "float32", "bfloat16", "float16"]
"""Dtypes of a separate generation engine (`models.gen_dtype`): a `ModelDtype`, or auto (picked from the hardware)."""


@dataclasses.dataclass(frozen=True)
class Pattern:
    """An open set of string values, checked like a choice: a field typed `Annotated[str, Pattern(...)]`."""

    regex: str
    """The values it takes (matched whole)."""
    text: str
    """The values in words, for messages and `--help-config`."""

    def matches(self, value: str) -> bool:
        """Whether `value` is one of the values."""
        return isinstance(value, str) and re.fullmatch(self.regex, value) is not None


DEVICE = Pattern(r"auto|cpu|cuda(:[0-9]+)?", "auto, cpu, cuda or cuda:N")
"""The device names `models.device` takes."""
Device = Annotated[str, DEVICE]
"""A torch device name (`models.device`): auto (cuda when available, else cpu), cpu, cuda or cuda:N."""


def choices(tp: Any) -> tuple[str, ...]:
    """The values of a `Literal` annotation (also inside `X | None`); () for any other type."""
    if typing.get_origin(tp) is Annotated:
        return choices(typing.get_args(tp)[0])
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
    hints = typing.get_type_hints(type(section), include_extras=True)
    for f in dataclasses.fields(section):
        allowed = choices(hints[f.name])
        value = getattr(section, f.name)
        if value is None and _optional(hints[f.name]):
            continue
        if allowed and value not in allowed:
            raise ValueError(f"{where}.{f.name} must be one of {allowed}, got {value!r}")
        known = pattern(hints[f.name])
        if known is not None and not known.matches(value):
            raise ValueError(f"{where}.{f.name} must be {known.text}, got {value!r}")


def pattern(tp: Any) -> Pattern | None:
    """The `Pattern` of an `Annotated[str, Pattern(...)]` annotation (also inside `X | None`); None for others."""
    if typing.get_origin(tp) is Annotated:
        return next((m for m in tp.__metadata__ if isinstance(m, Pattern)), None)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next((p for arg in typing.get_args(tp) if (p := pattern(arg)) is not None), None)
    return None


def _optional(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp)
