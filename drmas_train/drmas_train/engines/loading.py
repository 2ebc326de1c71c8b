"""A model without its weights, and where its weights lie: what shard-wise loading starts from.

`empty_model` builds a causal LM from its folder's config with every parameter on the meta device (no
memory) and its buffers (rotary tables and the like, which no checkpoint holds) computed as usual, so
the learner can shard it and read each rank's part from the files (`learner.shard_load`). `weight_files`
maps each tensor name of a folder's safetensors checkpoint to its file.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from drmas_train.config import ModelDtype

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Inside, every parameter a module registers is moved to the meta device; buffers stay where made.

    Parameters are created where torch puts them and moved at once, before any initialisation writes
    them, so their memory is never touched; buffers are left alone because most of them (rotary
    frequencies) are computed at construction and saved nowhere.
    """
    original = torch.nn.Module.register_parameter

    def register(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":  # a meta one is kept: ties stay ties
            p = module._parameters[name]
            module._parameters[name] = type(p)(p.to("meta"), requires_grad=p.requires_grad)

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = original


def empty_model(path: str | Path, *, dtype: ModelDtype) -> torch.nn.Module:
    """The causal LM of folder `path` in `dtype` with its parameters on the meta device (see the module doc).

    Torch's random state is left as it was (building on meta draws nothing that a whole load would not).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path)
    with torch.random.fork_rng(devices=[]), parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    return model


def weight_files(path: str | Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file of folder `path` that holds it (one file, or an index's shards).

    Raises:
        FileNotFoundError: the folder has neither `model.safetensors` nor its index.

    """
    folder = Path(path)
    if (folder / INDEX_FILE).is_file():
        weight_map = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    if (folder / SINGLE_FILE).is_file():
        from safetensors import safe_open

        with safe_open(folder / SINGLE_FILE, framework="pt") as f:
            return dict.fromkeys(f.keys(), folder / SINGLE_FILE)
    raise FileNotFoundError(f"{folder} holds no {SINGLE_FILE} nor {INDEX_FILE}: shard-wise loading reads safetensors")
