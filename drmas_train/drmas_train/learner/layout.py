"""Which records share a rank, a mini-batch and a micro-batch in one update, and what each micro-batch's loss
is divided by (`learner.batch_layout`).

"packed" (the project's): the update's records are shuffled (seeded) and split near-equally into
`mini_batches` mini-batches; each is cut into micro-batches of one LoRA adapter, sorted by token ids (by
length under `forward: plain`) so that records sharing a prompt prefix pack together, and the micro-batches
are dealt round-robin to the ranks.

"reference": verl's arithmetic inside a step, as langfengQ/DrMAS@19c632b runs it:
1. Copy-padding, before advantages (`pad_with_copies`; the reference's `adjust_batch(..., mode="copy")`):
   each model's records are padded with copies of its own records up to a multiple of
   lcm(log-prob micro-batch x W, micro-batch x W), W the model's data-parallel ranks: the whole batch
   while what is missing is at least the batch, then a draw without replacement; copies go after the
   records. The copies count in the advantages' group statistics and are trained.
2. Rank partitions (`balanced_partitions`; `_balance_batch`, `get_seqlen_balanced_partitions(...,
   equal_size=True)`): Karmarkar-Karp over the records' lengths (prompt + response tokens) into W
   partitions of equal size; rank r gets partition r, its indices sorted.
3. Mini- and micro-batches (`dp_actor.update_policy` with `use_adaptive_ppo_mini_batch_size`): each rank
   splits its partition contiguously into mini-batches of ceil(N / (mini_batches x W)) records (N the
   padded count), the last shorter, and each mini-batch into micro-batches of `micro_batch_size`, the
   last shorter. No shuffle; every epoch the same mini-batches.
4. Weights: under `loss_agg: micro_token_mean` a micro-batch's token-mean is divided by the gradient
   accumulation steps, the floor mini // micro of the full mini-batch size, and by W (FSDP averages the
   ranks' gradients); a mini-batch whose last micro-batch is short therefore weighs (micro-batches) /
   (mini // micro), not 1. Under `token_mean` every token of the mini-batch weighs the same, whatever
   the membership.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from drmas_train.algorithm.records import CallRecord
from drmas_train.config import LossAgg, PPOConfig
from drmas_train.learner.adapters import adapter_of, chunk_by_adapter


@dataclass
class MiniBatch:
    """One optimizer step's records, cut into micro-batches.

    Attributes:
        chunks: micro-batches of record indices; with W ranks, rank r runs chunks[r::W].
        n_micro: what a micro-batch's token-mean is divided by under `micro_token_mean` (with `loss_denominator`).

    """

    chunks: list[list[int]]
    n_micro: int


def loss_denominator(loss_agg: LossAgg, micro_tokens: int, minibatch_tokens: int, n_micro: int) -> float:
    """What a micro-batch's token-loss sum is divided by, so that the gradients summed over its
    micro-batches (and ranks) are those of the `loss_agg` loss of the whole mini-batch.

    Args:
        loss_agg: "token_mean" (every token of the mini-batch weighs the same) or "micro_token_mean"
            (each micro-batch's token-mean, divided by `n_micro`).
        micro_tokens: response tokens of this micro-batch.
        minibatch_tokens: response tokens of the whole mini-batch (every rank's micro-batches).
        n_micro: `MiniBatch.n_micro`: the micro-batches of the whole mini-batch ("packed"), or verl's
            gradient accumulation steps x W ("reference").

    """
    if loss_agg == "token_mean":
        return float(minibatch_tokens)
    return float(micro_tokens * n_micro)  # micro_token_mean


# ---- packed --------------------------------------------------------------------------------------
def packed_minibatches(
    records: Sequence[CallRecord], config: PPOConfig, rng: np.random.Generator | None, *, whole: bool = False
) -> list[MiniBatch]:
    """One epoch of "packed" mini-batches (`whole`: the records as one mini-batch, unshuffled)."""
    n = len(records)
    if whole or config.mini_batches == 1:
        splits = [np.arange(n)]
    else:
        splits = np.array_split(rng.permutation(n), min(config.mini_batches, n))
    by_prefix = config.forward != "plain"
    out = []
    for split in splits:
        chunks = chunk_by_adapter(records, [int(i) for i in split], config.micro_batch_size, by_prefix=by_prefix)
        out.append(MiniBatch(chunks, len(chunks)))
    return out


# ---- reference -----------------------------------------------------------------------------------
def padding_multiple(world_size: int, micro_batch_size: int, logprob_micro_batch_size: int | None) -> int:
    """lcm(log-prob micro-batch x W, micro-batch x W): what the reference pads each model's batch to a multiple of."""
    logprob = logprob_micro_batch_size or micro_batch_size
    return math.lcm(logprob * world_size, micro_batch_size * world_size)


def copy_indices(n: int, multiple: int, rng: np.random.Generator) -> list[int]:
    """The records to copy so that `n` becomes a multiple of `multiple` (the reference's rule, this RNG's draw)."""
    if n == 0 or n % multiple == 0:
        return []
    missing = multiple - n % multiple
    out: list[int] = []
    while missing >= n:
        out.extend(range(n))
        missing -= n
    out.extend(int(i) for i in rng.choice(n, missing, replace=False))
    return out


def pad_with_copies(records: Sequence[CallRecord], multiple: int, rng: np.random.Generator) -> list[CallRecord]:
    """The records followed by copies of some (`copy_indices`): a multiple of `multiple` records."""
    records = list(records)
    return records + [dataclasses.replace(records[i]) for i in copy_indices(len(records), multiple, rng)]


def pad_step(
    records: Sequence[CallRecord],
    configs: Mapping[str, PPOConfig],
    world_sizes: Mapping[str, int],
    rng: np.random.Generator,
) -> list[CallRecord]:
    """A step's records with each model's padded (`pad_with_copies`) where its learner config says "reference".

    Args:
        records: the step's records, of every model.
        configs: each model's learner config (`PPOConfig`).
        world_sizes: each model's data-parallel ranks (`world_size_of`).
        rng: draws the copies, model after model in `configs`' order.

    """
    out = list(records)
    for name, config in configs.items():
        if config.batch_layout != "reference":
            continue
        own = [r for r in records if r.model == name]
        multiple = padding_multiple(world_sizes[name], config.micro_batch_size, config.logprob_micro_batch_size)
        out.extend(pad_with_copies(own, multiple, rng)[len(own) :])
    return out


def world_size_of(learner: Any) -> int:
    """The data-parallel ranks of a `Learner` (its `dp`) or of a placed run's `RemoteLearner` (its `ranks`)."""
    ranks = getattr(learner, "ranks", None)
    if ranks is not None:
        return len(ranks)
    dp = getattr(learner, "dp", None)
    return 1 if dp is None else int(dp.world_size)


def balanced_partitions(seqlens: Sequence[int], k: int) -> list[list[int]]:
    """Karmarkar-Karp's largest differencing into `k` partitions of len(seqlens) / k indices each, balancing
    their sums; each partition's indices sorted (verl's `get_seqlen_balanced_partitions(..., equal_size=True)`).

    Ties break as verl's do: a set orders by (sum, size, items), a partial solution by its spread (largest
    first), then by its largest set (largest first).
    """
    n = len(seqlens)
    if k < 1 or n < k or n % k:
        raise ValueError(f"cannot split {n} records into {k} partitions of equal size")
    ranked = sorted((int(s), i) for i, s in enumerate(seqlens))
    heap = [_State([_Set(s, [(idx, s)]) for s, idx in ranked[o : o + k]], k) for o in range(0, n, k)]
    heapq.heapify(heap)
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        heapq.heappush(heap, first.merged(second))
    return [sorted(idx for idx, _ in s.items) for s in heap[0].sets]


@dataclass(frozen=True)
class _Set:
    """Items (index, length) and their total; ordered by (total, size, items), as verl's."""

    total: int
    items: list[tuple[int, int]]

    def key(self) -> tuple[int, int, list[tuple[int, int]]]:
        return self.total, len(self.items), self.items

    def __add__(self, other: _Set) -> _Set:
        return _Set(self.total + other.total, self.items + other.items)


class _State:
    """A partial solution: `k` sets, largest first."""

    def __init__(self, sets: list[_Set], k: int) -> None:
        sets = sets + [_Set(0, []) for _ in range(k - len(sets))]
        self.sets = sorted(sets, key=_Set.key, reverse=True)
        self.spread = self.sets[0].total - self.sets[-1].total

    def merged(self, other: _State) -> _State:
        k = len(self.sets)
        return _State([self.sets[i] + other.sets[k - 1 - i] for i in range(k)], k)

    def __lt__(self, other: _State) -> bool:  # heapq pops the largest spread first, then the largest set
        if self.spread != other.spread:
            return self.spread > other.spread
        return self.sets[0].key() > other.sets[0].key()


def reference_minibatches(
    records: Sequence[CallRecord], config: PPOConfig, world_size: int, *, whole: bool = False
) -> list[MiniBatch]:
    """One epoch of "reference" mini-batches of `world_size` ranks (`whole`: one mini-batch per rank).

    Records with no response tokens keep their places (their lengths count in the partitions) but are left
    out of the micro-batches, which may then be empty.

    Raises:
        ValueError: the records do not split into equal rank partitions (not padded), a mini-batch per
            rank is smaller than a micro-batch (verl would divide by zero accumulation steps), or a
            micro-batch mixes LoRA adapters (one forward pass runs one adapter).

    """
    n, micro = len(records), config.micro_batch_size
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in records]
    partitions = balanced_partitions(lengths, world_size)
    mini = n // world_size if whole else -(-n // (config.mini_batches * world_size))
    accumulation = mini // micro
    if accumulation == 0:
        raise ValueError(
            f"batch_layout reference: a mini-batch of {mini} records per rank is smaller than micro_batch_size {micro}"
        )
    out = []
    for start in range(0, n // world_size, mini):
        per_rank = [part[start : start + mini] for part in partitions]
        micros = [[idx[j : j + micro] for j in range(0, len(idx), micro)] for idx in per_rank]
        chunks = [rank[m] for m in range(len(micros[0])) for rank in micros]  # rank r: chunks[r::W]
        for chunk in chunks:
            if len({adapter_of(records[i]) for i in chunk}) > 1:
                raise ValueError("batch_layout reference: a micro-batch mixes LoRA adapters; use batch_layout packed")
        chunks = [[i for i in chunk if records[i].response_ids] for chunk in chunks]  # token-less: no pass
        out.append(MiniBatch(chunks, accumulation * world_size))
    return out
