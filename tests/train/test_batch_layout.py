"""`learner.batch_layout: reference` against a replay of the reference's rules (langfengQ/DrMAS@19c632b, its verl).

The replay below is written from the reference's code, not from ours: `adjust_batch(..., mode="copy")`
(agent_system/multi_turn_rollout/utils.py) pads a model's batch with copies, `_balance_batch`
(verl/trainer/ppo/ray_trainer.py) reorders it into `get_seqlen_balanced_partitions(..., equal_size=True)`
(verl/utils/seqlen_balancing.py, transcribed as `karmarkar_karp`), the dispatcher gives rank r the r-th
contiguous chunk, and `update_policy` (verl/workers/actor/dp_actor.py) splits it into mini- and
micro-batches and divides each micro-batch's token-mean by `gradient_accumulation` (FSDP then averages
over the W ranks). Given a batch's lengths, W and the copy indices, it computes every copy, every
micro-batch's membership and every token's loss weight; the project's layout must give the same.
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest

from drmas_train.algorithm.records import CallRecord
from drmas_train.config import PPOConfig
from drmas_train.learner.layout import (
    copy_indices,
    loss_denominator,
    pad_step,
    pad_with_copies,
    padding_multiple,
    reference_minibatches,
)

# The run scripts' sizes: rollout.log_prob_micro_batch_size_per_gpu, ppo_micro_batch_size_per_gpu,
# ppo_mini_update_num (examples/drmas_trainer/run_math.sh and run_search.sh).
SHAPES = {"math": (8, 4, 1), "search": (32, 4, 5)}


# ---- the reference's rules, transcribed -----------------------------------------------------------
def karmarkar_karp(seqlen_list, k_partitions):
    """verl/utils/seqlen_balancing.py: karmarkar_karp(..., equal_size=True), then each partition sorted."""

    class Set:
        def __init__(self):
            self.sum, self.items = 0, []

        def add(self, idx, val):
            self.items.append((idx, val))
            self.sum += val

        def merge(self, other):
            for idx, val in other.items:
                self.items.append((idx, val))
                self.sum += val

        def __lt__(self, other):
            if self.sum != other.sum:
                return self.sum < other.sum
            if len(self.items) != len(other.items):
                return len(self.items) < len(other.items)
            return self.items < other.items

    class State:
        def __init__(self, items, k):
            self.k = k
            self.sets = [Set() for _ in range(k)]
            for i, (idx, seqlen) in enumerate(items):
                self.sets[i].add(idx=idx, val=seqlen)
            self.sets = sorted(self.sets, reverse=True)

        def merge(self, other):
            for i in range(self.k):
                self.sets[i].merge(other.sets[self.k - 1 - i])
            self.sets = sorted(self.sets, reverse=True)

        @property
        def spread(self):
            return self.sets[0].sum - self.sets[-1].sum

        def __lt__(self, other):
            if self.spread != other.spread:
                return self.spread > other.spread
            return self.sets[0] > other.sets[0]

    sorted_seqlen_list = sorted([(seqlen, i) for i, seqlen in enumerate(seqlen_list)])
    states_pq = []
    assert len(seqlen_list) % k_partitions == 0
    for offset in range(0, len(sorted_seqlen_list), k_partitions):
        items = []
        for i in range(k_partitions):
            seqlen, idx = sorted_seqlen_list[offset + i]
            items.append((idx, seqlen))
        heapq.heappush(states_pq, State(items=items, k=k_partitions))
    while len(states_pq) > 1:
        state0 = heapq.heappop(states_pq)
        state1 = heapq.heappop(states_pq)
        state0.merge(state1)
        heapq.heappush(states_pq, state0)
    return [sorted(idx for idx, _ in s.items) for s in states_pq[0].sets]


def reference_copies(bs, size_divisor, rng):
    """adjust_batch mode "copy": the copied indices, in order (numpy's draw, here from `rng`)."""
    remainder = bs % size_divisor
    if remainder == 0:
        return []
    remaining, out = size_divisor - remainder, []
    while remaining > 0:
        if remaining >= bs:
            out.extend(range(bs))
            remaining -= bs
        else:
            out.extend(rng.choice(bs, remaining, replace=False).tolist())
            remaining = 0
    return out


def replay(lengths, tokens, world, copies, shape):
    """Every padded record's (mini-batch, rank, micro-batch, token weight) in the reference, and the divisor.

    Args:
        lengths: each record's attention-mask length (prompt + response tokens).
        tokens: each record's response tokens.
        world: W, the data-parallel ranks.
        copies: the copied record indices, in order.
        shape: (log-prob micro per GPU, micro per GPU, ppo_mini_update_num).

    """
    logprob_micro, micro, update_num = shape
    divisor = math.lcm(logprob_micro * world, logprob_micro * world, micro * world)
    lengths = list(lengths) + [lengths[i] for i in copies]
    tokens = list(tokens) + [tokens[i] for i in copies]
    assert len(lengths) % divisor == 0
    partitions = karmarkar_karp(lengths, world)
    order = [j for partition in partitions for j in partition]  # batch.reorder(global_idx)
    per_rank = len(order) // world  # dispatch: rank r gets the r-th contiguous chunk
    mini_size = -(-len(order) // (update_num * world))  # use_adaptive_ppo_mini_batch_size
    gradient_accumulation = mini_size // micro
    out = {}
    for rank in range(world):
        data = order[rank * per_rank : (rank + 1) * per_rank]
        for m, start in enumerate(range(0, len(data), mini_size)):  # batch.split(ppo_mini_batch_size)
            mini_batch = data[start : start + mini_size]
            for u, j in enumerate(range(0, len(mini_batch), micro)):  # mini_batch.split(micro)
                members = mini_batch[j : j + micro]
                n_tokens = sum(tokens[i] for i in members)  # masked_mean's denominator
                for i in members:  # policy_loss / gradient_accumulation; FSDP averages over ranks
                    out[i] = (m, rank, u, 1.0 / (n_tokens * gradient_accumulation * world))
    return out, divisor


# ---- the project's layout -----------------------------------------------------------------------
def make_records(lengths, tokens):
    return [
        CallRecord(
            group_id=i % 7, episode_id=i, agent="a", model="m", turn=0,
            prompt_ids=[1] * (p - r), response_ids=[2] * r, logprobs=[0.0] * r,
        )
        for i, (p, r) in enumerate(zip(lengths, tokens))
    ]  # fmt: skip


def project(records, world, shape):
    """The project's (mini-batch, rank, micro-batch, token weight) of every record."""
    _, micro, update_num = shape
    config = PPOConfig(batch_layout="reference", micro_batch_size=micro, mini_batches=update_num)
    out = {}
    for m, mini in enumerate(reference_minibatches(records, config, world)):
        n_tok = sum(len(records[i].response_ids) for c in mini.chunks for i in c)
        for rank in range(world):
            for u, chunk in enumerate(mini.chunks[rank::world]):
                micro_tokens = sum(len(records[i].response_ids) for i in chunk)
                weight = 1.0 / loss_denominator("micro_token_mean", micro_tokens, n_tok, mini.n_micro)
                out.update({i: (m, rank, u, weight) for i in chunk})
    return out


def batch(n, seed):
    """`n` records' lengths and response tokens, with many ties (the partition's tie-breaks matter)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, 60, n)
    lengths = tokens + rng.choice([40, 80, 120, 200], n)
    return lengths.tolist(), tokens.tolist()


def mini_weight_sums(layout, tokens):
    sums = {}
    for i, (m, _, _, w) in layout.items():
        sums[m] = sums.get(m, 0.0) + w * tokens[i]
    return [sums[m] for m in sorted(sums)]


CASES = [("math", 300), ("search", 700), ("search", 1500), ("search", 1000), ("search", 640), ("search", 2560)]


@pytest.mark.parametrize("world", [1, 4, 8])
@pytest.mark.parametrize("shape, n", CASES)
def test_the_layout_replays_the_reference(shape, n, world):
    lengths, tokens = batch(n, seed=n + world)
    logprob_micro, micro, _ = SHAPES[shape]
    multiple = padding_multiple(world, micro, logprob_micro)
    copies = reference_copies(n, multiple, np.random.default_rng(n))
    expected, divisor = replay(lengths, tokens, world, copies, SHAPES[shape])
    assert multiple == divisor
    records = make_records(lengths, tokens)
    padded = records + [records[i] for i in copies]
    got = project(padded, world, SHAPES[shape])
    assert sorted(got) == sorted(expected) == list(range(len(padded)))
    for i, (m, rank, u, weight) in expected.items():
        assert got[i][:3] == (m, rank, u), i
        assert got[i][3] == pytest.approx(weight, rel=1e-12, abs=0)
    # what the project draws follows the same rule: as many copies, whole batches first, then distinct records
    drawn = copy_indices(n, multiple, np.random.default_rng(0))
    assert len(drawn) == len(copies) and (n + len(drawn)) % multiple == 0
    whole = len(drawn) // n * n
    assert drawn[:whole] == list(range(n)) * (len(drawn) // n)
    assert len(set(drawn[whole:])) == len(drawn) - whole


def _figures(shape, n, world=4):
    lengths, tokens = batch(n, seed=1)
    logprob_micro, micro, _ = SHAPES[shape]
    copies = copy_indices(n, padding_multiple(world, micro, logprob_micro), np.random.default_rng(0))
    padded_tokens = tokens + [tokens[i] for i in copies]
    layout, _ = replay(lengths, tokens, world, copies, SHAPES[shape])
    records = make_records(lengths, tokens)
    got = project(records + [records[i] for i in copies], world, SHAPES[shape])
    mini_sizes = [sum(1 for m, r, _, _ in got.values() if (m, r) == (k, 0)) for k in range(1 + max(got.values())[0])]
    return len(copies), mini_sizes, mini_weight_sums(layout, padded_tokens), mini_weight_sums(got, padded_tokens)


@pytest.mark.parametrize(
    "shape, n, copies, sizes, sums",
    [
        ("math", 300, 20, [80], [1.0]),
        ("search", 700, 68, [39, 39, 39, 39, 36], [10 / 9] * 4 + [1.0]),
        ("search", 1500, 36, [77, 77, 77, 77, 76], [20 / 19] * 4 + [1.0]),
        ("search", 1000, 24, [52, 52, 52, 52, 48], [1.0] * 4 + [12 / 13]),
        ("search", 640, 0, [32] * 5, [1.0] * 5),
        ("search", 2560, 0, [128] * 5, [1.0] * 5),
    ],
)
def test_pinned_figures_at_four_ranks(shape, n, copies, sizes, sums):
    got_copies, got_sizes, replayed, ours = _figures(shape, n)
    assert (got_copies, got_sizes) == (copies, sizes)
    assert replayed == pytest.approx(sums, rel=1e-12) and ours == pytest.approx(sums, rel=1e-12)


def test_math_pads_as_much_at_eight_ranks():
    assert _figures("math", 300, world=8)[0] == 20  # lcm(8 x 8, 4 x 8) = 64: 300 -> 320


def test_padding_copies_records_after_the_originals_and_only_for_reference_models():
    lengths, tokens = batch(10, seed=3)
    records = make_records(lengths, tokens)
    padded = pad_with_copies(records, 8, np.random.default_rng(5))
    drawn = copy_indices(10, 8, np.random.default_rng(5))
    assert len(padded) == 16 and padded[:10] == records
    assert padded[10:] == [records[i] for i in drawn] and all(c is not records[i] for c, i in zip(padded[10:], drawn))
    other = [CallRecord(0, 0, "b", "n", 0, [1], [2], [0.0])] * 3
    configs = {"m": PPOConfig(batch_layout="reference", micro_batch_size=2), "n": PPOConfig(micro_batch_size=2)}
    step = pad_step(records + other, configs, {"m": 2, "n": 2}, np.random.default_rng(5))
    assert len([r for r in step if r.model == "m"]) == 12 and len([r for r in step if r.model == "n"]) == 3


def test_unpadded_batches_and_short_mini_batches_are_refused():
    lengths, tokens = batch(10, seed=3)
    records = make_records(lengths, tokens)
    with pytest.raises(ValueError, match="equal size"):
        reference_minibatches(records, PPOConfig(batch_layout="reference"), 4)
    with pytest.raises(ValueError, match="smaller than micro_batch_size"):
        reference_minibatches(records, PPOConfig(batch_layout="reference", micro_batch_size=4, mini_batches=5), 1)


def test_paper_presets_lay_out_as_the_reference_and_cpu_presets_pack():
    from drmas_train.config import build_config, list_presets, load_preset

    for name in list_presets():
        learner = build_config(name).learner
        script = load_preset(name).get("reference", "")
        if "examples/drmas_trainer/" in script:
            logprob_micro, micro, update_num = SHAPES["math" if "run_math.sh" in script else "search"]
            assert learner.batch_layout == "reference", name
            assert (learner.logprob_micro_batch_size, learner.micro_batch_size) == (logprob_micro, micro), name
            assert (learner.mini_batches, learner.loss_agg) == (update_num, "micro_token_mean"), name
        else:
            assert learner.batch_layout == "packed", name
