"""The learner's data-parallel strategies: which micro-batches this rank runs, and how gradients meet.

- `Alone`: one process runs every micro-batch.
- `Replicate` (`dp.strategy == "replicate"`): every rank gets the same records, computes every
  W-th micro-batch (W ranks) and the summed gradients (`DataParallel.all_reduce_grads`) equal the
  one-process gradient, since each micro-batch's loss is divided by the whole mini-batch's token
  count. Metrics are summed over the ranks, so every rank returns the same numbers.
- `Sharded` (`dp.strategy == "fsdp"`, model sharded with `distributed.shard_module` before the
  learner is built): every forward and backward is a collective, so every rank runs as many passes
  as the largest share, padding with zero-weight passes (gradient unchanged, no metrics); FSDP
  reduce-scatters the gradients itself, and norms are gathered whole. The optimizer state is
  gathered whole to save and cut to this rank's shards to load (collectives, on every rank at once).

The learner asks its strategy only through the methods of `Alone`, so the PPO step is the same code
for a local run and for every rank of a placed one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from drmas_train.learner.distributed import (
    DataParallel,
    UsedParams,
    full_optimizer_state,
    load_sharded_optimizer_state,
)
from drmas_train.learner.metrics import UpdateMetrics


class Alone:
    """One process: every micro-batch here, nothing to reduce."""

    sharded = False

    def passes(self, chunks: Sequence[list[int]]) -> list[tuple[list[int], bool]]:
        """The passes of this rank over the mini-batch's micro-batches: (micro-batch, real?) pairs.

        A pass that is not real is a zero-weight pass (FSDP's collectives need one per pass).
        """
        return [(list(c), True) for c in chunks]

    def begin(self) -> None:
        """Before a mini-batch's passes."""

    def finish(self, params: Sequence[torch.nn.Parameter]) -> None:
        """After a mini-batch's passes: make `.grad` the whole mini-batch's gradient on every rank."""

    def adapter_switched(self, params: Sequence[torch.nn.Parameter]) -> None:
        """After a peft adapter switch (which freezes the other adapters)."""

    def reduce(self, metrics: UpdateMetrics, device: torch.device) -> None:
        """Make the update's metrics the sum over the ranks."""

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's state in the one-process format."""
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load a one-process-format optimizer state."""
        optimizer.load_state_dict(state)


class Replicate(Alone):
    """A full replica per rank; this rank runs micro-batches rank, rank + W, ...; gradients all-reduced."""

    def __init__(self, dp: DataParallel) -> None:
        self.dp = dp

    def passes(self, chunks: Sequence[list[int]]) -> list[tuple[list[int], bool]]:
        return [(list(c), True) for c in self.dp.shard(chunks)]

    def finish(self, params: Sequence[torch.nn.Parameter]) -> None:
        self.dp.all_reduce_grads(params)

    def reduce(self, metrics: UpdateMetrics, device: torch.device) -> None:
        metrics.reduce(self.dp, device)


class Sharded(Replicate):
    """FSDP2: the ranks run equally many passes; unused parameters get back `grad=None`."""

    sharded = True

    def __init__(self, dp: DataParallel, model: torch.nn.Module, params: Sequence[torch.nn.Parameter]) -> None:
        super().__init__(dp)
        check_sharded(model, params)
        # FSDP gives unused parameters zero gradients: track use to restore one process's None.
        self.used = UsedParams(model, params)

    def passes(self, chunks: Sequence[list[int]]) -> list[tuple[list[int], bool]]:
        mine = super().passes(chunks)
        largest = -(-len(chunks) // self.dp.world_size)  # rank 0's share
        # chunks[0] is computed for real by rank 0, so the padding uses no parameter it does not.
        return mine + [(list(chunks[0]), False)] * (largest - len(mine))

    def begin(self) -> None:
        self.used.reset()

    def finish(self, params: Sequence[torch.nn.Parameter]) -> None:
        self.used.drop_unused_grads(params, self.dp)

    def adapter_switched(self, params: Sequence[torch.nn.Parameter]) -> None:
        # peft freezes the other adapters; FSDP reduce-scatters only parameters that require grad,
        # so ranks on different adapters would reduce-scatter different tensors.
        for p in params:
            p.requires_grad_(True)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return full_optimizer_state(optimizer)

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        load_sharded_optimizer_state(optimizer, state)


def make_strategy(dp: DataParallel | None, model: torch.nn.Module, params: Sequence[torch.nn.Parameter]) -> Alone:
    """The strategy for this process's place (`dp` None: alone)."""
    if dp is None:
        return Alone()
    return Sharded(dp, model, params) if dp.sharded else Replicate(dp)


def is_fsdp(model: torch.nn.Module) -> bool:
    """Whether `model` was sharded with FSDP2 (`fully_shard`)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def check_sharded(model: torch.nn.Module, params: Sequence[torch.nn.Parameter]) -> None:
    """FSDP needs the model sharded before the optimizer takes its parameters (else they are stale)."""
    from torch.distributed.tensor import DTensor

    if not is_fsdp(model) or not all(isinstance(p, DTensor) for p in params):
        raise ValueError(
            "the 'fsdp' strategy needs the model sharded (distributed.shard_module) before the Learner is built"
        )
