"""Compiled decoder layers for the learner's passes (`learner.compile_layers`).

What it buys: in an eager forward and backward the matmuls are not the whole cost; each layer's
RMSNorms, rotary embedding, SiLU, residual adds and (under bf16 autocast) weight casts are dozens of
small element-wise kernels, each a trip through memory. Inductor fuses them into a few: the updates get
faster once the first one has compiled (measured in benchmarks/results/learner_precision.md).

Why layers and not the whole model: the decoder layers are one piece of code run N times, so dynamo
compiles one graph whose inputs include the parameters and every layer reuses it; the model's own
forward around them (embeddings, masks, the learner's replaced LM head) stays eager, so peft adapters
and the head replacement work unchanged. Shapes are dynamic: every micro-batch has its own length, and
one graph serves them all instead of a recompile per length.

Why only inside the learner's passes: the same module may also generate (the transformers backend),
with a KV cache and another graph; the compiled layers are swapped into the model's layer list for the
duration of an update and the eager ones put back after, so the module tree (state_dict keys,
checkpoints) never changes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's list of decoder layers (`get_decoder().layers`: transformers and peft models)."""
    get_decoder = getattr(model, "get_decoder", None)
    layers = getattr(get_decoder(), "layers", None) if callable(get_decoder) else None
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(
            f"learner.compile_layers needs a model whose get_decoder().layers is its list of decoder layers; "
            f"{type(model).__name__} has none"
        )
    return layers


def check_compiler(device_type: str) -> None:
    """Inductor builds CPU kernels with a C++ compiler; say so before the first update, not inside it."""
    if device_type != "cpu":
        return
    candidates = [os.environ.get("CXX", ""), "g++", "c++", "clang++"]
    if not any(c and shutil.which(c) for c in candidates):
        raise RuntimeError(
            "learner.compile_layers on a CPU needs a C++ compiler (inductor builds its kernels with one): "
            "install g++ or set learner.compile_layers false"
        )


class CompiledLayers:
    """torch.compile'd twins of a model's decoder layers, active inside `active()` only.

    Args:
        model: a causal LM with `get_decoder().layers`.

    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.layers = decoder_layers(model)
        check_compiler(next(model.parameters()).device.type)
        self.eager = list(self.layers)
        # The twins share the layers' parameters; nothing compiles until the first call.
        self.compiled = [torch.compile(layer, dynamic=True) for layer in self.eager]

    @contextmanager
    def active(self) -> Iterator[None]:
        """Run the model with the compiled layers inside the block; the eager ones are back after it."""
        for i, layer in enumerate(self.compiled):
            self.layers[i] = layer
        try:
            yield
        finally:
            for i, layer in enumerate(self.eager):
                self.layers[i] = layer
