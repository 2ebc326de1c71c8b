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

Two strategies (`DataParallel.strategy`):
- "replicate" (the above): a full replica per rank; generation and checkpoints read rank 0 alone.
- "fsdp": FSDP2 (`torch.distributed.fsdp.fully_shard`, applied by `shard_module`): every parameter,
  gradient and AdamW moment is a DTensor sharded over the ranks (dim 0), so a rank holds 1/W of
  them. FSDP all-gathers a layer's weights inside its forward and reduce-scatters its gradients in
  backward, so every forward and backward is a collective: the ranks must run the same number of
  passes (the learner pads a short share with zero-weight passes) and anything reading full
  weights (the generation engine) must gather them on every rank at once (`full_state_dict`);
  checkpoints gather nothing: each rank writes its own shards (`policy_shards`). Gradients are summed,
  not averaged, over the ranks, as in "replicate".
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from drmas_train.config import PoolStrategy

log = logging.getLogger(__name__)

T = TypeVar("T")
BUCKET_ELEMENTS = 1 << 25
"""Gradients are all-reduced in flat buckets of at most this many elements (128 MiB of fp32)."""
STRATEGIES = ("replicate", "fsdp")
"""Data-parallel strategies: a full replica per rank, or parameters sharded with FSDP2."""


@dataclass
class DataParallel:
    """A process's place in a data-parallel group.

    Attributes:
        rank: this rank, 0 .. world_size - 1; rank 0 also generates and is what checkpoints read.
        world_size: the number of ranks training the model.
        group: the torch.distributed process group (None: the default group).
        strategy: "replicate" (a full replica per rank, gradients all-reduced) or "fsdp" (parameters
            sharded with `shard_module`; FSDP reduce-scatters the gradients itself).

    """

    rank: int
    world_size: int
    group: Any = None
    strategy: PoolStrategy = "replicate"

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"data-parallel strategy must be one of {STRATEGIES}, got {self.strategy!r}")

    @property
    def sharded(self) -> bool:
        """Whether parameters are sharded (FSDP): forward and backward passes are then collectives."""
        return self.strategy == "fsdp"

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


# ---- FSDP -----------------------------------------------------------------------------------------
def decoder_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a causal LM (peft-wrapped or not): FSDP's units of all-gather.

    Found by class name (`...DecoderLayer`, as HF names them in Llama, Qwen, Mistral, ...), else the children
    of the first `layers` ModuleList (HF's `model.model.layers`); empty when neither exists.
    """
    layers = [m for m in module.modules() if type(m).__name__.endswith("DecoderLayer")]
    if layers:
        return layers
    for name, m in module.named_modules():
        if name.split(".")[-1] == "layers" and isinstance(m, torch.nn.ModuleList):
            return list(m)
    return []


def shard_module(module: torch.nn.Module, dp: DataParallel, device_type: str | None = None) -> torch.nn.Module:
    """Shard a model over the ranks with FSDP2: each decoder layer, then the root (embeddings, head).

    Call it on every rank before building the optimizer (`Learner`): `fully_shard` replaces the
    parameters by DTensor shards, so parameter lists taken before are stale. Rank 0's weights are
    broadcast first, so every rank shards the same model.

    Gradients are summed over the ranks (divide factor 1, plain SUM reduce-scatter): the learner
    already divides each micro-batch's loss by the whole mini-batch's token count. Parameters a
    rank did not use (another LoRA adapter than its micro-batches') are reduce-scattered as zeros,
    so every rank reduce-scatters the same tensors in every backward; the learner restores
    `grad=None` for those no rank used.

    Args:
        module: a causal LM (transformers or peft), on this rank's device, identical on every rank
            up to rank 0's broadcast.
        dp: this rank's group; its strategy must be "fsdp".
        device_type: where the shards will live, for a module built on the meta device (then nothing
            is broadcast: every rank reads its shards from the files, `shard_load.load_sharded`).

    Returns:
        The same module, sharded in place (its class becomes an `FSDPModule`).

    """
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if not dp.sharded:
        raise ValueError(f"shard_module needs the 'fsdp' strategy, got {dp.strategy!r}")
    if device_type is None:  # a module on the meta device has nothing to broadcast (`shard_load`)
        dp.broadcast_module(module)
        device_type = next(module.parameters()).device.type
    mesh = DeviceMesh.from_group(dp.group or dist.group.WORLD, device_type)
    for layer in decoder_layers(module):
        fully_shard(layer, mesh=mesh)
    fully_shard(module, mesh=mesh)
    for m in module.modules():
        if isinstance(m, FSDPModule):
            # Sum, not average: factor 1 with SUM-only comms (gloo has no AVG nor PREMUL_SUM).
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    module.set_reduce_scatter_unused_params(True, recurse=True)
    return module


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor gathered whole (a collective: every rank must call it), any other tensor as is."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def _shard_like(ref: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """`full` cut like the DTensor `ref` (this rank slices its own part: no communication)."""
    if not isinstance(ref, DTensor):
        return full
    full = full.to(device=ref.device, dtype=ref.dtype)
    return distribute_tensor(full, ref.device_mesh, ref.placements, src_data_rank=None)


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's state dict with every tensor whole, on the CPU (under FSDP a collective).

    Under FSDP every rank must call it at once (each DTensor is all-gathered in turn); what the
    generation engine and checkpoints need instead of rank 0's `state_dict()`.
    """
    return {k: full_tensor(v).detach().cpu() for k, v in module.state_dict().items()}


def load_full_state_dict(module: torch.nn.Module, tensors: Mapping[str, torch.Tensor], *, strict: bool = True) -> None:
    """Load whole tensors into a (possibly FSDP-sharded) module: each rank keeps its own shards.

    Every rank must be given the same whole tensors; no communication takes place.
    """
    current = module.state_dict()
    module.load_state_dict(
        {k: _shard_like(current[k], v) if k in current else v for k, v in tensors.items()}, strict=strict
    )


def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """`optimizer.state_dict()` with every DTensor gathered whole onto the CPU (a collective).

    The result has the one-process format (state keyed by parameter position), so it loads into
    an unsharded optimizer too. Every rank gathers, in the same (sorted) order, and gets it whole.
    """
    sd = optimizer.state_dict()
    state = {i: {k: _gathered(v) for k, v in sorted(sd["state"][i].items())} for i in sorted(sd["state"])}
    return {"state": state, "param_groups": sd["param_groups"]}


def _gathered(v: Any) -> Any:
    return full_tensor(v).detach().cpu() if isinstance(v, DTensor) else v


def load_sharded_optimizer_state(optimizer: torch.optim.Optimizer, sd: Mapping[str, Any]) -> None:
    """Load a whole-tensor optimizer state (`full_optimizer_state`) into an FSDP-sharded optimizer.

    Every rank must be given the same state; each keeps the shards of its own parameters.
    """
    params = [p for g in optimizer.param_groups for p in g["params"]]
    state = {}
    for i, entry in sd["state"].items():
        p = params[int(i)]
        state[i] = {k: _shard_like(p, v) if _is_full_of(p, v) else v for k, v in entry.items()}
    optimizer.load_state_dict({"state": state, "param_groups": sd["param_groups"]})


def _is_full_of(p: torch.Tensor, v: Any) -> bool:
    """Whether `v` is a plain whole tensor shaped like the DTensor parameter `p` (e.g. exp_avg, not step)."""
    return isinstance(p, DTensor) and isinstance(v, torch.Tensor) and not isinstance(v, DTensor) and v.shape == p.shape


class UsedParams:
    """Which parameters took part in a forward pass with grad enabled since `reset`.

    Under FSDP, parameters a rank did not use get zero gradients (so that every rank
    reduce-scatters the same tensors); one process leaves them at `grad=None`, which makes AdamW
    skip them (no weight decay, no moment update). Tracking use by the forward pre-hooks of the
    modules that own the parameters lets `drop_unused_grads` restore None where no rank used them.
    Hooks see the modules' registered parameters only through the indices precomputed here, since
    FSDP swaps in unsharded parameter objects during forward.
    """

    def __init__(self, module: torch.nn.Module, params: Sequence[torch.nn.Parameter]) -> None:
        index = {id(p): i for i, p in enumerate(params)}
        self.used = [False] * len(params)
        self._hooks = []
        for m in module.modules():
            own = sorted({index[id(p)] for p in m.parameters(recurse=False) if id(p) in index})
            if own:
                self._hooks.append(m.register_forward_pre_hook(partial(self._mark, own)))

    def _mark(self, indices: Iterable[int], module: torch.nn.Module, args: Any) -> None:
        if torch.is_grad_enabled():  # no-grad passes (old or reference log-probs) make no gradient
            for i in indices:
                self.used[i] = True

    def reset(self) -> None:
        """Forget the uses seen so far (at the start of a mini-batch)."""
        self.used = [False] * len(self.used)

    def drop_unused_grads(self, params: Sequence[torch.nn.Parameter], dp: DataParallel) -> None:
        """Set `grad=None` on the parameters no rank used (a collective: every rank must call it)."""
        counts = dp.sum([float(u) for u in self.used], _device(params))
        for p, n in zip(params, counts):
            if n == 0:
                p.grad = None


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


def _store(rank: int, world_size: int, host: str, port: int, timeout: timedelta) -> dist.TCPStore:
    """The group's key-value store, served by rank 0 on host:port alone.

    torch's own rendezvous (`tcp://`) serves it on every interface; rank 0 here listens on `host` only, so
    the ranks of a local Ray meet on 127.0.0.1 and nothing outside the machine reaches the store.
    """
    if rank != 0:
        return dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen()
    return dist.TCPStore(host, port, world_size, is_master=True, timeout=timeout, master_listen_fd=sock.detach())


def join(
    rank: int, world_size: int, host: str, port: int, *, timeout_s: float = 600.0, strategy: PoolStrategy = "replicate"
) -> DataParallel:
    """Join the data-parallel group whose rank 0 listens at host:port (blocks until all ranks join).

    Args:
        rank: this process's rank.
        world_size: the number of ranks.
        host: rank 0's address (`rendezvous_address` run on rank 0).
        port: the free port rank 0 picked.
        timeout_s: how long collectives may wait for a missing rank before failing.
        strategy: "replicate" or "fsdp" (see `DataParallel`).

    Returns:
        This process's `DataParallel`.

    """
    if strategy not in STRATEGIES:  # fail now rather than after blocking on the rendezvous
        raise ValueError(f"data-parallel strategy must be one of {STRATEGIES}, got {strategy!r}")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not dist.is_initialized():
        timeout = timedelta(seconds=timeout_s)
        store = _store(rank, world_size, host, port, timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    log.info("data-parallel rank %d of %d joined (%s, %s:%d)", rank, world_size, backend, host, port)
    return DataParallel(rank=rank, world_size=world_size, strategy=strategy)
