"""The reference's flat index on GPUs: its vectors in contiguous shards, one per GPU, under `faiss.IndexShards`.

Search-R1's server reads the whole `e5_Flat.index` into host memory and moves it to every GPU with
`faiss.index_cpu_to_all_gpus` (float16, sharded). Here the vectors are memory-mapped from the file and
added to each shard chunk by chunk, so host memory holds one chunk, not the whole file. The shards are
made by a factory: on GPUs a `GpuIndexFlatIP` per device, on CPU an `IndexFlatIP`, so everything but the
GPU index itself runs, and is tested, on a CPU machine. Search is exact (flat); ids are passage positions
(`successive_ids`: shard i's ids start after shard i-1's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from drmas_envs.search.retrievers.faiss_lib import import_faiss, keep_alive
from drmas_envs.search.retrievers.vectors import CHUNK

ShardFactory = Callable[[int, int], Any]
"""make(dim, shard number) -> an empty inner-product index for that shard."""


def shard_bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous [start, end) row ranges covering `n` rows, sizes differing by at most one."""
    if parts < 1:
        raise ValueError(f"at least one shard is needed, got {parts}")
    edges = [n * i // parts for i in range(parts + 1)]
    return list(zip(edges[:-1], edges[1:]))


def cpu_shard(dim: int, part: int) -> Any:
    """An IndexFlatIP: the shard factory of a CPU machine."""
    return import_faiss().IndexFlatIP(dim)


def sharded_flat(vectors: np.ndarray, parts: int, make: ShardFactory = cpu_shard, chunk: int = CHUNK) -> Any:
    """An IndexShards over `vectors` (n x dim float32, may be memory-mapped) split into `parts` contiguous
    shards made by `make`, filled `chunk` rows at a time; its search equals one flat index's.
    """
    faiss = import_faiss()
    n, dim = vectors.shape
    shards = faiss.IndexShards(dim, True, True)  # threaded: the shards search at once; successive ids
    for part, (start, end) in enumerate(shard_bounds(n, parts)):
        shard = make(dim, part)
        for lo in range(start, end, chunk):
            shard.add(np.ascontiguousarray(vectors[lo : min(lo + chunk, end)], dtype=np.float32))
        shards.add_shard(shard)
        keep_alive(shards, shard)
    return shards


def check_gpus(faiss: Any, devices: Sequence[int]) -> None:
    """Raise one clear error unless this faiss has GPU support and sees every GPU in `devices`."""
    named = ",".join(map(str, devices))
    if not hasattr(faiss, "StandardGpuResources"):
        raise ValueError(
            f"--gpus {named}: this faiss ({faiss.__version__}) is CPU-only; install a GPU build (Search-R1 uses "
            "conda install -c pytorch -c nvidia faiss-gpu) or serve without --gpus"
        )
    seen = faiss.get_num_gpus()
    missing = [d for d in devices if d >= seen]
    if missing:
        raise ValueError(f"--gpus {named}: faiss sees {seen} GPU(s) (ids below {seen}), not GPU {missing[0]}")


def gpu_flat(vectors: np.ndarray, devices: Sequence[int], float16: bool = True) -> Any:
    """`vectors` in one `GpuIndexFlatIP` shard per device of `devices` (float16 unless `float16` is False).

    Raises:
        ValueError: faiss has no GPU support, or does not see one of `devices`.

    """
    faiss = import_faiss()
    check_gpus(faiss, devices)
    resources = []

    def make(dim: int, part: int) -> Any:
        res = faiss.StandardGpuResources()
        resources.append(res)
        cfg = faiss.GpuIndexFlatConfig()
        cfg.device = int(devices[part])
        cfg.useFloat16 = bool(float16)
        return faiss.GpuIndexFlatIP(res, dim, cfg)

    index = sharded_flat(vectors, len(devices), make)
    keep_alive(index, *resources)
    return index
