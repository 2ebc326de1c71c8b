"""Shard-wise loading: a model built on the meta device is sharded with FSDP2, then each rank reads its shards.

No rank ever holds a whole parameter of the model it shards, on the device or on the host:

1. the model is built with its parameters on the meta device (`engines.loading.empty_model`);
2. `distributed.shard_module` shards it (FSDP2 `fully_shard`; nothing to broadcast);
3. `module.to_empty` allocates each rank's shards (FSDP2 re-registers them as its sharded parameters),
   and the buffers built on the host at construction are put back;
4. each parameter's shard is read from the safetensors files: FSDP2 cuts dim 0 as `torch.chunk`
   does, so rank r of W holds rows [r * ceil(n / W), ...) and reads only those rows
   (`safe_open(...).get_slice(name)[start:stop]`), converted to the model's dtype and copied into its
   local shard. The transient host memory is one tensor's shard at a time.

Every rank reads the same files, so the shards equal a whole load's exactly. The files' tensor names
must be the module's parameter names (as `save_pretrained` writes them; a tied output head is read
from the embedding it shares). A LoRA-wrapped model is not loaded this way (its adapters are drawn at
random, not read), nor one whose parameters are not all sharded on dim 0.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Shard

from drmas_train.engines.loading import weight_files
from drmas_train.learner.distributed import DataParallel, shard_module


def load_sharded(module: torch.nn.Module, path: str | Path, dp: DataParallel, device: torch.device) -> torch.nn.Module:
    """Shard `module` (parameters on the meta device) over `dp`'s ranks and fill this rank's shards from `path`.

    Every rank must call it at once (sharding builds the FSDP groups).

    Args:
        module: a causal LM from `empty_model`: parameters on meta, buffers built.
        path: its folder, with `model.safetensors` or an index of safetensors shards.
        dp: this rank's group (strategy "fsdp").
        device: where this rank's shards live.

    Returns:
        The same module, sharded, every parameter a DTensor holding this rank's rows of the files.

    Raises:
        ValueError: a parameter is not on the meta device, is not sharded on dim 0, or its name is
            not in the files (or its shape differs from theirs).

    """
    on_host = [n for n, p in module.named_parameters() if p.device.type != "meta"]
    if on_host:
        raise ValueError(f"shard-wise loading needs parameters on the meta device; {on_host[:3]} are not")
    buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
    shard_module(module, dp, device_type=device.type)
    module.to_empty(device=device)
    files = weight_files(path)
    with torch.no_grad(), ExitStack() as stack:
        opened: dict[Path, Any] = {}

        def reader(name: str) -> Any:
            if name not in files:
                raise ValueError(f"{name!r} is not in the safetensors files of {path}")
            file = files[name]
            if file not in opened:
                from safetensors import safe_open

                opened[file] = stack.enter_context(safe_open(file, framework="pt"))
            return opened[file]

        for name, param in module.named_parameters():
            _fill_shard(param, name, reader(name), dp)
        for name, buf in module.named_buffers():
            saved = reader(name).get_tensor(name) if name in files else buffers[name]
            buf.copy_(saved.to(buf.dtype))
    return module


def shard_rows(rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """The rows [start, stop) of a dim-0 length `rows` that rank `rank` of `world_size` holds (`torch.chunk`'s cut)."""
    chunk = math.ceil(rows / world_size) if rows else 0
    start = min(rank * chunk, rows)
    return start, min(start + chunk, rows)


def _fill_shard(param: torch.Tensor, name: str, f: Any, dp: DataParallel) -> None:
    """Copy this rank's rows of tensor `name` in the open file `f` into the sharded parameter."""
    sliced = f.get_slice(name)
    shape = tuple(sliced.get_shape())
    if shape != tuple(param.shape):
        raise ValueError(f"{name!r} is {shape} in the files but {tuple(param.shape)} in the model")
    if not isinstance(param, DTensor) or tuple(param.placements) != (Shard(0),):
        raise ValueError(f"{name!r} is not sharded on dim 0; shard-wise loading reads dim-0 shards only")
    local = param.to_local()
    start, stop = shard_rows(shape[0], dp.rank, dp.world_size)
    if local.shape[0] != stop - start:
        raise ValueError(f"{name!r}: rank {dp.rank} holds {local.shape[0]} rows, expected {stop - start}")
    if stop > start:
        local.copy_(sliced[start:stop].to(local.dtype))
