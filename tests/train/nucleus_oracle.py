"""What a backend's sampled log-prob must be at top-p < 1, computed independently of both backends.

Both backends report log softmax(logits / T) renormalised over the call's top-p nucleus of that
tempered distribution (vLLM's `processed_logprobs`; the transformers backend does the same). The ratio
`learner.old_logprobs` "sampled" and "decoupled" take, exp(learner - behaviour) with the learner's
un-renormalised log softmax(logits / T), is therefore the nucleus's mass at the token's context: a
function of the context alone, whichever token was sampled and whichever backend sampled it.

Tolerance (`log_ratio_bounds`), from float rounding only. Let `atol` bound how far one fp32
implementation's log-probs lie from another's for the same context (cached decoding against one full
pass, vLLM's CPU kernels against torch's). Then every probability the engine sees is within a factor
e^(+-atol) of the oracle's, so any partial sum of them (at most 1) is within expm1(atol) of the
oracle's, and the engine's fp32 cumulative sum over V tokens adds at most (V - 1) * 2^-24 (the
bound for recursive summation of non-negative terms). Its nucleus therefore holds every token the
oracle keeps at top_p - slack and none the oracle drops at top_p + slack, slack the sum of the two:
a token whose boundary lies within that slack may fall either way (on one CPU's rounding or
another's), any other is decided. Its log mass lies within atol of the masses of those two sets,
and the learner's log-prob adds one more atol: log ratio in [log m(top_p - slack) - 2 atol,
log m(top_p + slack) + 2 atol].
"""

from __future__ import annotations

import math

import torch

LOGP_ATOL = 1e-4
"""The bound on fp32 log-prob differences between implementations of one forward pass: the tolerance the
backend tests already hold the two backends' greedy log-probs to (test_vllm_backend.py)."""


def nucleus_log_mass(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Per row of `logp` (log-probs over the vocabulary), the log of the mass its top-p nucleus keeps.

    A full sort in float64: a token is dropped once the mass of the more likely tokens reaches top_p.
    """
    probs = logp.double().exp().sort(-1, descending=True).values
    kept = (probs.cumsum(-1) - probs) < top_p
    return (probs * kept).sum(-1).log()


def log_ratio_bounds(logp: torch.Tensor, top_p: float, atol: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(low, high) per row: where log exp(learner - behaviour) of a token sampled at that context may lie.

    `logp`: the oracle's log softmax(logits / T), one row per context; `atol`: the bound on
    log-prob differences between implementations (see the module doc).
    """
    slack = math.expm1(atol) + (logp.shape[-1] - 1) * 2.0**-24
    low = nucleus_log_mass(logp, top_p - slack) - 2 * atol
    high = nucleus_log_mass(logp, min(top_p + slack, 1.0)) + 2 * atol
    return low, high
