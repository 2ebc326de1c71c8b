"""Mixed precision for the learner: bf16 matmuls over fp32 master weights (`learner.compute_dtype`).

The model's parameters, gradients and AdamW state stay in the dtype they were loaded in
(`models.dtype`, fp32 by default); under bf16 compute the forward runs inside `torch.autocast`, so
matmuls (and attention) take bf16 copies of fp32 weights and their backward produces fp32 gradients,
as verl's FSDP mixed precision does. The log-softmax over the vocabulary runs in fp32; the LM head's
matmul too by default (`learner.head_dtype` float32: log-probs, hence PPO ratios and the sampler gap,
at fp32 resolution), or in bf16 like the body (compute, verl's choice; `forward.head_scores`).

Autocast casts each fp32 weight to bf16 when a forward first uses it and caches the copy until the
outermost autocast block exits. One block per micro-batch would cast every weight again for each
micro-batch; `keep_casts` holds the cache over all the micro-batches of one optimizer step (the weights
do not change between them), which changes no value: the copies are the same casts.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from drmas_train.config import ComputeDtype
from drmas_train.engines.settings import native_bf16

log = logging.getLogger(__name__)


def resolve_compute_dtype(requested: ComputeDtype, *, device_type: str, weights: torch.dtype) -> torch.dtype | None:
    """The autocast dtype for `learner.compute_dtype` on this machine, or None for no autocast.

    Args:
        requested: "auto", "float32" or "bfloat16".
        device_type: the weights' device type ("cpu" or "cuda").
        weights: the weights' dtype; autocast only applies to fp32 weights (bf16 weights already
            compute in bf16).

    """
    if requested == "float32" or weights != torch.float32:
        return None
    native, why = native_bf16(device_type)
    if requested == "auto":
        log.info("learner compute_dtype auto -> %s (%s)", "bfloat16" if native else "float32", why)
        return torch.bfloat16 if native else None
    if not native:  # bfloat16
        log.warning("learner.compute_dtype bfloat16 on a %s: bf16 matmul is far slower than fp32 there", why)
    return torch.bfloat16


@contextlib.contextmanager
def compute_in(dtype: torch.dtype | None, device_type: str) -> Iterator[None]:
    """Autocast to `dtype` on `device_type` inside the block (nothing when `dtype` is None)."""
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device_type, dtype=dtype):
        yield


@contextlib.contextmanager
def keep_casts(dtype: torch.dtype | None, device_type: str) -> Iterator[None]:
    """Keep autocast's bf16 copies of the weights for the whole block (nothing when `dtype` is None).

    An outer autocast block that is itself disabled: forwards inside still autocast through their own
    `compute_in`, backward runs without autocast as before, and the cache is cleared only when this block
    exits. Use it around the micro-batches of one optimizer step only: a copy outlives any change made
    to its weight inside the block.
    """
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device_type, enabled=False):
        yield


def carry_residual_in(model: torch.nn.Module, dtype: torch.dtype, layers: list[torch.nn.Module]) -> list[Any]:
    """Carry the hidden states between `layers` in `dtype` while autocast to `dtype` is on
    (`learner.residual_dtype` compute).

    The embedding's output and each layer's incoming hidden states are cast to `dtype`, so gradient
    checkpointing saves each layer's input at `dtype`'s size and the residual additions round to it, as under
    verl's FSDP mixed precision (bf16 parameters: every activation bf16). Outside autocast (the transformers
    engine generating with the learner's model) nothing is cast. Returns the hooks' handles.
    """

    def cast(x: Any) -> Any:
        on = isinstance(x, torch.Tensor) and x.is_floating_point() and torch.is_autocast_enabled(x.device.type)
        return x.to(dtype) if on and torch.get_autocast_dtype(x.device.type) == dtype else x

    def before_layer(_module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if args:
            return (cast(args[0]), *args[1:]), kwargs
        if "hidden_states" in kwargs:
            kwargs["hidden_states"] = cast(kwargs["hidden_states"])
        return args, kwargs

    handles = [model.get_input_embeddings().register_forward_hook(lambda _m, _a, out: cast(out))]
    handles += [layer.register_forward_pre_hook(before_layer, with_kwargs=True) for layer in layers]
    return handles
