"""Data-parallel training of one model across the ranks of its pool, over torch.distributed.

Semantics (DDP's, done by hand so that gradient accumulation stays exact):
- Every rank holds a full replica and receives the whole mini-batch. The learner cuts it into
  micro-batches as in one process, and rank r computes micro-batches r, r + W, r + 2W, ... (W ranks).
- Each micro-batch's token-loss sum is divided by the token count of the whole mini-batch, as in one
  process, so summing the ranks' gradients (`all_reduce_grads`) gives every rank the single-process
  gradient, up to float summation order. The ranks then clip with the same norm and take the same
  optimizer step, so the replicas never drift apart; rank 0's weights are broadcast once at start.
- A parameter no rank touched (an unused LoRA adapter) keeps `grad=None`, so AdamW skips it exactly
  as it would in one process.
- Backend: NCCL when the ranks are on GPUs, gloo on CPUs. The process group is joined over TCP at
  rank 0's address, so the ranks may sit on several nodes.

FSDP (sharded parameters) is not used: it needs every rank to run the same number of forward
passes and a collective to rebuild the weights for the generation engine; a replica per rank keeps
generation and checkpoints unchanged.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

T = TypeVar("T")
BUCKET_ELEMENTS = 1 << 25
"""Gradients are all-reduced in flat buckets of at most this many elements (128 MiB of fp32)."""


@dataclass
class DataParallel:
    """A process's place in a data-parallel group.

    Attributes:
        rank: this rank, 0 .. world_size - 1; rank 0 also generates and is what checkpoints read.
        world_size: the number of ranks training the model.
        group: the torch.distributed process group (None: the default group).

    """

    rank: int
    world_size: int
    group: Any = None

    def shard(self, chunks: Sequence[T]) -> list[T]:
        """The share of the micro-batches of this rank: every `world_size`-th one, starting at `rank`."""
        return list(chunks[self.rank :: self.world_size])

    def all_reduce_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum the parameters' gradients over the ranks, in place; untouched everywhere stays None."""
        touched = torch.tensor([float(p.grad is not None) for p in params], device=_device(params))
        dist.all_reduce(touched, group=self.group)
        live = [p for p, t in zip(params, touched.tolist()) if t > 0]
        for p in live:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for bucket in _buckets(live):
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])
            dist.all_reduce(flat, group=self.group)
            offset = 0
            for p in bucket:
                n = p.grad.numel()
                p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
                offset += n

    def sum(self, values: Sequence[float], device: torch.device | str = "cpu") -> list[float]:
        """Sum a list of floats over the ranks."""
        t = torch.tensor(list(values), dtype=torch.float64, device=device)
        dist.all_reduce(t, group=self.group)
        return t.tolist()

    def max(self, value: float, device: torch.device | str = "cpu") -> float:
        """The largest of one float over the ranks."""
        t = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return float(t.item())

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Make every rank's parameters and buffers rank 0's."""
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0, group=self.group)


def _device(params: Sequence[torch.nn.Parameter]) -> torch.device:
    return params[0].device if params else torch.device("cpu")


def _buckets(params: Sequence[torch.nn.Parameter]) -> list[list[torch.nn.Parameter]]:
    """Consecutive parameters of one dtype and device, at most `BUCKET_ELEMENTS` per bucket (or one)."""
    out: list[list[torch.nn.Parameter]] = []
    size = 0
    for p in params:
        if out and size + p.numel() <= BUCKET_ELEMENTS and (out[-1][0].dtype, out[-1][0].device) == (p.dtype, p.device):
            out[-1].append(p)
            size += p.numel()
        else:
            out.append([p])
            size = p.numel()
    return out


def rendezvous_address() -> tuple[str, int]:
    """The address of this host and a free TCP port on it: where the other ranks join rank 0."""
    try:
        import ray

        host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    except ImportError:
        host = "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return host, int(s.getsockname()[1])


def join(rank: int, world_size: int, host: str, port: int, *, timeout_s: float = 600.0) -> DataParallel:
    """Join the data-parallel group whose rank 0 listens at host:port (blocks until all ranks join).

    Args:
        rank: this process's rank.
        world_size: the number of ranks.
        host: rank 0's address (`rendezvous_address` run on rank 0).
        port: the free port rank 0 picked.
        timeout_s: how long collectives may wait for a missing rank before failing.

    Returns:
        This process's `DataParallel`.

    """
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(
            backend,
            init_method=f"tcp://{host}:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
    log.info("data-parallel rank %d of %d joined (%s, %s:%d)", rank, world_size, backend, host, port)
    return DataParallel(rank=rank, world_size=world_size)
