"""The learner's forward strategies: per-token log-probs (and entropy) of call records' responses.

One forward per micro-batch, either way:
- "plain": prompts left-padded, responses right-padded, one row per record (`loss.make_batch`).
- "shared_prefix": the records packed into one row as a prefix tree (`prefix_tree`), every shared
  prefix computed once, with a 4D ancestor mask and depth position ids. Exact: the same log-probs
  and gradients as "plain" up to float summation order. Needs an attention implementation that
  takes a custom 4D mask (SDPA or eager).
- "auto": "shared_prefix" for a micro-batch whose tree has at most `AUTO_MAX_TREE_SHARE` of the
  plain batch's tokens (padding included), else "plain".

Either way the model's own forward runs (so FSDP's hooks, peft adapters and gradient checkpointing
behave as usual) and the hidden states that predict response tokens are gathered before the LM head:
prompt positions never reach the head. The gather is an `index_select` inside the head's replacement,
not the model's `logits_to_keep` index: in a prefix tree one position predicts the first token of
every response that shares its prompt, and the backward of advanced indexing with repeated indices
(`index_put_` with accumulate) adds them with atomics on a multi-threaded CPU, in an order that
changes from run to run under load; `index_select`'s backward (`index_add_`) adds in a fixed order.
The head itself runs on chunks of at most `chunk_tokens` positions, each turned into log-probs (and
entropy) at once, so the [positions, vocabulary] logits are never whole; under autograd with more
than one chunk, each chunk is recomputed in backward (activation checkpointing) instead of kept, which
bounds memory at one chunk's logits (a 4096-token response at Qwen's 151,936-token vocabulary is 2.5 GB of fp32 logits).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from drmas_train.algorithm.records import CallRecord
from drmas_train.config import Forward, HeadDtype
from drmas_train.learner.loss import make_batch
from drmas_train.learner.prefix_tree import pack_prefix_tree, tree_length

AUTO_MAX_TREE_SHARE = 0.75
""""auto" packs a micro-batch when its tree has at most this share of the padded batch's tokens."""
ENTROPY = ("off", "metric", "loss")
"""Entropy per token: not computed, computed without gradient (logged), or with gradient (in the loss)."""
_MASKABLE = ("sdpa", "eager")


@dataclass
class Scores:
    """Per-token results of one micro-batch, right-padded to the longest response R."""

    logp: torch.Tensor  # [B, R] float32 log-probs of the response tokens
    entropy: torch.Tensor | None  # [B, R] float32, or None when not asked for
    mask: torch.Tensor  # [B, R] bool, True on real response tokens


def _attn_implementation(model: torch.nn.Module) -> str:
    return str(getattr(model.config, "_attn_implementation", None) or "eager")


def choose_forward(model: torch.nn.Module, records: Sequence[CallRecord], forward: Forward) -> str:
    """The strategy one micro-batch runs with: "plain" or "shared_prefix" (see the module doc)."""
    maskable = _attn_implementation(model) in _MASKABLE
    if forward == "shared_prefix" and not maskable:
        raise ValueError(
            f"forward shared_prefix needs SDPA or eager attention (a custom 4D mask), the model uses "
            f"{_attn_implementation(model)!r}; set learner.forward to plain or auto"
        )
    if forward != "auto":
        return forward
    if not maskable or len(records) < 2:
        return "plain"
    prompts, responses = [r.prompt_ids for r in records], [r.response_ids for r in records]
    padded = len(records) * (max(map(len, prompts)) + max(max(map(len, responses)), 1))
    return "shared_prefix" if tree_length(prompts, responses) <= AUTO_MAX_TREE_SHARE * padded else "plain"


def score(
    model: torch.nn.Module,
    records: Sequence[CallRecord],
    *,
    pad_token_id: int = 0,
    forward: Forward = "plain",
    entropy: str = "off",
    chunk_tokens: int = 1024,
    tree_multiple: int = 1,
    head_dtype: HeadDtype = "float32",
) -> Scores:
    """Log-probs (and entropy) of each record's response under softmax(logits / T), T its own temperature.

    Args:
        model: a causal LM (transformers, peft or FSDP-wrapped) whose head is `get_output_embeddings()`.
        records: the micro-batch (every prompt at least one token).
        pad_token_id: padding id of the plain layout (its value never matters).
        forward: "plain", "shared_prefix" or "auto" (`choose_forward`).
        entropy: one of `ENTROPY`.
        chunk_tokens: response positions whose logits are materialised at once.
        tree_multiple: pad a packed prefix tree to a multiple of this many tokens (`PackedRow.padded`).
        head_dtype: under autocast, "float32" runs the LM head outside it, "compute" inside (`head_scores`).

    Returns:
        The micro-batch's `Scores`.

    """
    if entropy not in ENTROPY:
        raise ValueError(f"entropy must be one of {ENTROPY}, got {entropy!r}")
    device = next(model.parameters()).device
    prompts, responses = [r.prompt_ids for r in records], [r.response_ids for r in records]
    shape = (len(records), max(max(map(len, responses)), 1))
    if choose_forward(model, records, forward) == "shared_prefix":
        row = pack_prefix_tree(prompts, responses, device=device).padded(tree_multiple, pad_token_id)
        mask = row.ancestor_mask().to(device)[None, None]
        if _attn_implementation(model) == "eager":  # eager adds the mask to the scores
            dtype = next(model.parameters()).dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, torch.finfo(dtype).min)
        inputs = dict(input_ids=row.input_ids, attention_mask=mask, position_ids=row.position_ids)
        keep, select, rows, cols, targets = row.predict, None, row.rows, row.cols, row.targets
    else:
        batch = make_batch(prompts, responses, pad_token_id=pad_token_id, device=device)
        p_len = batch.input_ids.shape[1] - shape[1]
        inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
        keep = torch.arange(p_len - 1, p_len - 1 + shape[1], device=device)
        select = batch.response_mask
        rows, cols = select.nonzero(as_tuple=True)
        targets = batch.response_ids[select]
    temps = torch.tensor([r.score_temperature for r in records], dtype=torch.float32, device=device)[rows]
    scorer = partial(
        _score_hidden,
        keep=keep,
        select=select,
        targets=targets,
        temps=temps,
        entropy=entropy,
        chunk=chunk_tokens,
        head_dtype=head_dtype,
    )
    with _head_replaced_by(model, scorer):
        # logits_to_keep=0: every position reaches the replaced head, which gathers `keep` (module doc)
        out = model(**inputs, logits_to_keep=0, use_cache=False).logits[0]  # [N, 2]
    logp = torch.zeros(shape, dtype=torch.float32, device=device).index_put((rows, cols), out[:, 0])
    ent = None
    if entropy != "off":
        ent = torch.zeros(shape, dtype=torch.float32, device=device).index_put((rows, cols), out[:, 1])
    resp_mask = torch.zeros(shape, dtype=torch.bool, device=device).index_put(
        (rows, cols), torch.ones_like(rows, dtype=torch.bool)
    )
    return Scores(logp, ent, resp_mask)


@contextmanager
def _head_replaced_by(model: torch.nn.Module, fn: Callable[..., torch.Tensor]) -> Iterator[None]:
    """Make the LM head compute `fn(head_forward, hidden)` inside the model's own forward.

    The head keeps its hooks and parameters (FSDP gathers them in the root's forward; a peft head
    keeps its adapters); only what it computes changes: scores instead of [*, V] logits.
    """
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError("the model has no output embeddings (LM head) to score with")
    own = head.__dict__.get("forward")
    original = head.forward
    head.forward = partial(fn, original)
    try:
        yield
    finally:
        if own is None:
            del head.forward
        else:
            head.forward = own


def _score_hidden(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    *,
    keep: torch.Tensor,
    select: torch.Tensor | None,
    targets: torch.Tensor,
    temps: torch.Tensor,
    entropy: str,
    chunk: int,
    head_dtype: HeadDtype,
) -> torch.Tensor:
    """The head's replacement: [1, N, 2] (log-prob, entropy) of the N scored positions of `hidden`."""
    hidden = hidden.index_select(1, keep)  # deterministic backward, unlike hidden[:, keep] (module doc)
    flat = hidden[select] if select is not None else hidden.reshape(-1, hidden.shape[-1])
    return head_scores(head, flat, targets, temps, entropy=entropy, chunk=chunk, head_dtype=head_dtype)[None]


def head_scores(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temps: torch.Tensor,
    *,
    entropy: str = "off",
    chunk: int = 1024,
    head_dtype: HeadDtype = "float32",
) -> torch.Tensor:
    """[N, 2]: log-prob of each target (and entropy, 0 when "off") under softmax(head(hidden) / T).

    Runs `head` on chunks of `chunk` positions; under autograd with several chunks each one is
    recomputed in backward rather than kept (exact, one chunk's logits in memory at a time). Under
    autocast the head runs in fp32 outside it (`head_dtype` "float32") or inside it ("compute": bf16
    logits); the log-softmax is fp32 either way.
    """
    n = hidden.shape[0]
    if n == 0:
        return hidden.new_zeros((0, 2), dtype=torch.float32)
    if head_dtype == "float32" and torch.is_autocast_enabled(hidden.device.type):  # learner/precision.py
        with torch.autocast(hidden.device.type, enabled=False):
            return head_scores(head, hidden.float(), targets, temps, entropy=entropy, chunk=chunk)
    recompute = torch.is_grad_enabled() and n > chunk
    fn = partial(_chunk_scores, head, entropy=entropy)
    parts = []
    for s in range(0, n, chunk):
        args = (hidden[s : s + chunk], targets[s : s + chunk], temps[s : s + chunk])
        parts.append(checkpoint(fn, *args, use_reentrant=False) if recompute else fn(*args))
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _chunk_scores(head: Any, hidden: torch.Tensor, targets: torch.Tensor, temps: torch.Tensor, *, entropy: str):
    """[n, 2] (log-prob, entropy) of one chunk; [n, V] temporaries are reused in place where autograd allows."""
    logits = head(hidden)
    # A fp32 head output is not saved by its own backward, so it may be scaled in place.
    logits = logits.div_(temps[:, None]) if logits.dtype == torch.float32 else logits.float() / temps[:, None]
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    if entropy == "off":
        return torch.stack([logp, torch.zeros_like(logp)], dim=-1)
    # H = -sum p log p = lse - sum p * logit; with gradient only when it is in the loss.
    if entropy == "loss" and torch.is_grad_enabled():
        ent = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    else:
        with torch.no_grad():
            ent = lse - torch.softmax(logits, dim=-1).mul_(logits).sum(-1)
    return torch.stack([logp, ent], dim=-1)
