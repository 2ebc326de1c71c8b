"""The sharded checkpoint format: each rank writes its own shard as safetensors, with a JSON index.

A checkpoint folder holds, per policy `<name>`, the files of every rank `r` that wrote:

- `weights-<name>.rank-<r>.safetensors`: the rank's slice of each weight tensor (under FSDP its local
  shard, `DTensor.to_local()`; a whole tensor without FSDP, written by rank 0 alone);
- `weights-<name>.rank-<r>.json`: the index of that file: per tensor its global shape, dtype, the
  dimension it is cut along (None: whole) and the offset of the slice along it;
- `learner-<name>.rank-<r>.safetensors` / `.json`: the same for the learner's state (the optimizer's
  moments and step counts as tensors, its hyperparameters and the learner's counters as JSON, in the
  tree the learner's `state_dict` returns);

and `index.json` (written by the driver once every rank has written): the format and, per policy, the
ranks that wrote. Nothing is gathered whole into one process to write it.

A reader reassembles each tensor from the slices that overlap the range it wants (`read_tree`): the
whole tensor (eval, export, a single process) or one rank's own shard of a new mesh (a resume onto
another rank count reads only the slices overlapping that shard). Nothing is unpickled: tensors are
read by `safetensors`, everything else is JSON, and a tree that names anything but tensors and plain
values is refused.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
from torch.distributed.tensor import DTensor, Shard

FORMAT = "drmas-sharded-1"
INDEX = "index.json"


class UntrustedCheckpointError(ValueError):
    """A checkpoint file holds more than tensors and plain values: loading it could run code."""


class IncompleteCheckpointError(ValueError):
    """A checkpoint's shards do not cover a tensor (a rank's files are missing)."""


def _refused(path: Path, why: object) -> UntrustedCheckpointError:
    return UntrustedCheckpointError(
        f"{path} holds more than tensors and plain values (a crafted file, or one from another program: {why}): "
        "it was not loaded"
    )


Range = tuple[int, int, int]
"""(dim, start, end): the slice of a tensor along `dim`."""


def is_sharded_checkpoint(folder: Path) -> bool:
    """Whether `folder` is a checkpoint of this format (else the older torch-file format)."""
    return (folder / INDEX).is_file()


def local_range(t: torch.Tensor) -> Range | None:
    """The slice of the global tensor a DTensor's local shard holds (None: a whole, replicated tensor).

    FSDP shards along one dimension of a 1-D mesh, as `torch.chunk` cuts: ceil(n / W) rows per rank.
    """
    if not isinstance(t, DTensor):
        return None
    shards = [p for p in t.placements if isinstance(p, Shard)]
    if not shards:
        return None
    if len(t.placements) != 1:
        raise ValueError(f"only 1-D meshes are supported, got placements {t.placements}")
    dim, n = shards[0].dim, t.shape[shards[0].dim]
    world, rank = t.device_mesh.size(), t.device_mesh.get_local_rank()
    size = -(-n // world)
    start = min(rank * size, n)
    return dim, start, min(start + size, n)


def as_like(local: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`local` (this rank's slice) as a tensor like `like`: a DTensor on its mesh, or a plain tensor."""
    if not isinstance(like, DTensor):
        return local
    local = local.to(device=like.to_local().device, dtype=like.dtype)
    return DTensor.from_local(local, like.device_mesh, like.placements, shape=like.shape, stride=like.stride())


def write_shard(folder: Path, stem: str, rank: int, tree: Any, *, whole_too: bool) -> int:
    """Write this rank's part of `tree` as `<stem>.rank-<rank>.safetensors` and its `.json` index.

    Args:
        folder: the checkpoint's (temporary) folder, shared by every rank.
        stem: `weights-<name>` or `learner-<name>`.
        rank: this rank.
        tree: nested dicts, lists and plain values with tensors (DTensors: their local shard is written).
        whole_too: also write the tensors that are not sharded (one rank does: rank 0).

    Returns:
        The bytes of tensors written.

    """
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, dict[str, Any]] = {}
    seen: dict[tuple[Any, ...], str] = {}

    def put(key: str, t: torch.Tensor) -> dict[str, Any]:
        rng = local_range(t)
        local = t.to_local() if isinstance(t, DTensor) else t
        entry: dict[str, Any] = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
        if rng is None and not whole_too:
            return {"tensor": key}
        if rng is not None:
            entry.update(dim=rng[0], offset=rng[1])
        where = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(local.shape), local.stride())
        alias = where if local.numel() else None
        if alias in seen:  # tied weights: safetensors stores no two views of one storage
            entry["same_as"] = seen[alias]
        else:
            if alias is not None:
                seen[alias] = key
            tensors[key] = local.detach().to("cpu").contiguous()
        meta[key] = entry
        return {"tensor": key}

    encoded = _encode(tree, "", put)
    safetensors.torch.save_file(tensors, str(folder / f"{stem}.rank-{rank:05d}.safetensors"))
    index = {"format": FORMAT, "rank": rank, "tree": encoded, "tensors": meta}
    (folder / f"{stem}.rank-{rank:05d}.json").write_text(json.dumps(index))
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _encode(obj: Any, key: str, put: Callable[[str, torch.Tensor], dict[str, Any]]) -> Any:
    """`obj` as JSON: tensors become {"tensor": key}; dicts with keys that are not strings keep them typed."""
    if isinstance(obj, torch.Tensor):
        return put(key.removeprefix("/"), obj)
    if isinstance(obj, Mapping):
        if all(isinstance(k, str) for k in obj):
            return {"dict": {k: _encode(v, f"{key}/{k}", put) for k, v in obj.items()}}
        return {"items": [[k, _encode(v, f"{key}/{k}", put)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {"list": [_encode(v, f"{key}/{i}", put) for i, v in enumerate(obj)]}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return {"value": obj}
    raise TypeError(f"a checkpoint holds tensors and plain values; {key or 'the state'} is a {type(obj).__name__}")


Slicer = Callable[[str, list[int]], Range | None]
"""(tensor key, global shape) -> the range to read (None: the whole tensor)."""


def read_tree(folder: Path, stem: str, slicer: Slicer | None = None) -> Any:
    """The tree `write_shard` wrote for `stem` on every rank, each tensor reassembled from its slices.

    `slicer` picks the part of each tensor to read (a rank of a new mesh: its own shard); only the
    files holding slices that overlap it are read, and of those only the overlapping rows.
    """
    ranks = sorted(folder.glob(f"{stem}.rank-*.json"))
    if not ranks:
        raise FileNotFoundError(f"{folder} holds no {stem} shards")
    indices = [(p.with_suffix(".safetensors"), _index(p)) for p in ranks]
    pieces: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    for path, index in indices:
        for key, entry in index["tensors"].items():
            pieces.setdefault(key, []).append((path, entry))
    handles: dict[Path, Any] = {}
    try:

        def get(key: str) -> torch.Tensor:
            found = pieces.get(key)
            if not found:
                raise IncompleteCheckpointError(f"{folder}: no rank wrote tensor {key!r} of {stem}")
            shape = found[0][1]["shape"]
            want = slicer(key, shape) if slicer else None
            return _assemble(key, shape, found, want, lambda p: _open(handles, p), get)

        try:
            return _decode(indices[0][1]["tree"], get)
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, (UntrustedCheckpointError, IncompleteCheckpointError)):
                raise
            raise _refused(ranks[0], exc) from exc
    finally:
        handles.clear()


def _open(handles: dict[Path, Any], path: Path) -> Any:
    if path not in handles:
        try:
            handles[path] = safetensors.safe_open(str(path), framework="pt")
        except (safetensors.SafetensorError, OSError) as exc:
            raise _refused(path, exc) from exc
    return handles[path]


def _index(path: Path) -> dict[str, Any]:
    try:
        index = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise _refused(path, exc) from exc
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise _refused(path, f"not a {FORMAT} shard index")
    return index


def _assemble(key, shape, found, want: Range | None, open_file, get) -> torch.Tensor:
    """Tensor `key` (or its range `want`) from the slices in `found`: (file, index entry) pairs."""
    first = found[0][1]
    if "same_as" in first:  # a view of the same storage and shape: the same range of it
        return get(first["same_as"])
    if "dim" not in first:  # whole: one file holds it; only the wanted rows are read
        handle = open_file(found[0][0])
        if want is None:
            return handle.get_tensor(key)
        index = [slice(None)] * len(shape)
        index[want[0]] = slice(want[1], want[2])
        return handle.get_slice(key)[tuple(index)]
    dim = first["dim"]
    start, end = (0, shape[dim]) if want is None else (want[1], want[2])
    if want is not None and want[0] != dim:
        raise ValueError(f"{key} was saved cut along dim {dim}; asked for dim {want[0]}")
    parts = []
    for path, entry in sorted(found, key=lambda f: f[1]["offset"]):
        handle = open_file(path)
        lo = entry["offset"]
        hi = lo + handle.get_slice(key).get_shape()[dim]
        a, b = max(lo, start), min(hi, end)
        if a >= b:
            continue
        index = [slice(None)] * len(shape)
        index[dim] = slice(a - lo, b - lo)
        parts.append(handle.get_slice(key)[tuple(index)])
    if not parts:
        return torch.empty([*shape[:dim], 0, *shape[dim + 1 :]], dtype=getattr(torch, first["dtype"]))
    out = torch.cat(parts, dim) if len(parts) > 1 else parts[0]
    if out.shape[dim] != end - start:
        raise IncompleteCheckpointError(
            f"{key}: the shards cover {out.shape[dim]} of rows {start}..{end} along dim {dim}"
        )
    return out


def _decode(node: Any, get: Callable[[str], torch.Tensor]) -> Any:
    if not isinstance(node, dict) or len(node) != 1:
        raise ValueError(f"not a checkpoint tree node: {str(node)[:80]}")
    ((kind, body),) = node.items()
    if kind == "tensor":
        return get(body)
    if kind == "value":
        if body is not None and not isinstance(body, (bool, int, float, str)):
            raise ValueError(f"not a plain value: {str(body)[:80]}")
        return body
    if kind == "dict":
        return {k: _decode(v, get) for k, v in body.items()}
    if kind == "items":
        return {k: _decode(v, get) for k, v in body}
    if kind == "list":
        return [_decode(v, get) for v in body]
    raise ValueError(f"not a checkpoint tree node: {kind!r}")


def write_index(folder: Path, ranks: Mapping[str, list[int]]) -> None:
    """The checkpoint's `index.json`: per policy, the ranks that wrote (written once every rank has)."""
    (folder / INDEX).write_text(json.dumps({"format": FORMAT, "policies": {n: sorted(r) for n, r in ranks.items()}}))


def policy_names(folder: Path) -> list[str]:
    """The policies a sharded checkpoint holds, each with every rank's files present."""
    index = json.loads((folder / INDEX).read_text())
    if index.get("format") != FORMAT:
        raise ValueError(f"{folder / INDEX} is not a {FORMAT} index")
    for name, ranks in index["policies"].items():
        for r in ranks:
            for stem in (f"weights-{name}", f"learner-{name}"):
                if not (folder / f"{stem}.rank-{r:05d}.json").is_file():
                    raise FileNotFoundError(f"{folder} lacks rank {r}'s {stem} shard")
    return list(index["policies"])
