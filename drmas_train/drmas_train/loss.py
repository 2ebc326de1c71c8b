"""Pure tensor functions of the PPO learner: response log-probs, the dual-clip loss, k3 KL.

Shapes: B sequences, R = the longest response in the batch; `mask[b, t]` marks real response tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class Batch:
    """Prompts left-padded to P, responses right-padded to R: every response starts at column P.

    That layout lets the model return logits for the last R + 1 positions only (`logits_to_keep`),
    which matters when prompts are long (multi-agent contexts) and the vocabulary is large.
    """

    input_ids: torch.Tensor  # [B, P + R]
    attention_mask: torch.Tensor  # [B, P + R]
    position_ids: torch.Tensor  # [B, P + R], 0 at each row's first real token
    response_ids: torch.Tensor  # [B, R]
    response_mask: torch.Tensor  # [B, R], bool


def make_batch(
    prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *, pad_token_id: int, device=None
) -> Batch:
    """Pack exact prompt and response ids into one padded batch (see `Batch`)."""
    if len(prompts) != len(responses) or not prompts:
        raise ValueError(f"need as many prompts as responses (>0), got {len(prompts)} and {len(responses)}")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token (the first response token is predicted from it)")
    p_len = max(len(p) for p in prompts)
    r_len = max(max(len(r) for r in responses), 1)
    b = len(prompts)
    ids = torch.full((b, p_len + r_len), pad_token_id, dtype=torch.long)
    att = torch.zeros((b, p_len + r_len), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, p_len - len(p) : p_len] = torch.as_tensor(list(p), dtype=torch.long)
        ids[i, p_len : p_len + len(r)] = torch.as_tensor(list(r), dtype=torch.long)
        att[i, p_len - len(p) : p_len + len(r)] = 1
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    resp_mask = att[:, p_len:].bool()
    batch = Batch(ids, att, pos, ids[:, p_len:], resp_mask)
    if device is not None:
        batch = Batch(*(t.to(device) for t in (ids, att, pos, batch.response_ids, resp_mask)))
    return batch


def response_logits(model, batch: Batch) -> torch.Tensor:
    """Logits that predict each response token: [B, R, V] (position P - 1 + t predicts token t)."""
    r_len = batch.response_ids.shape[1]
    kwargs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids)
    try:
        logits = model(**kwargs, logits_to_keep=r_len + 1, use_cache=False).logits
    except TypeError:  # a model without `logits_to_keep`: compute all positions and slice
        logits = model(**kwargs, use_cache=False).logits
    return logits[:, -(r_len + 1) : -1, :]


def _tempered(logits: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """float32 logits / temperature; a tensor temperature is per row ([B]) or per position ([B, R])."""
    logits = logits.float()
    if isinstance(temperature, torch.Tensor):
        t = temperature.to(device=logits.device, dtype=torch.float32)
        return logits / t.reshape(t.shape + (1,) * (logits.dim() - t.dim()))
    return logits / temperature if temperature != 1.0 else logits


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, *, temperature: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """Per-token log-prob of `targets` under softmax(logits / temperature): [B, R].

    Computed in float32 whatever the model dtype, since log-prob differences drive the PPO ratio.
    log p = logit - logsumexp(logits), which avoids materialising a [B, R, V] log-softmax.
    `temperature` may be a tensor: one per row ([B], each call's own) or per position ([B, R]).
    """
    logits = _tempered(logits, temperature)
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor, *, temperature: float | torch.Tensor = 1.0) -> torch.Tensor:
    """Per-position entropy of softmax(logits / temperature): [B, R] (tensor temperatures as `token_logprobs`)."""
    logp = torch.log_softmax(_tempered(logits, temperature), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def ppo_token_losses(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO clipped-ratio loss with dual clip on negative advantages.

    loss = max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high)); for A < 0 the loss is
    further capped at -A * dual_clip (Ye et al. 2020), so one token whose ratio exploded under a
    negative advantage cannot dominate the update.

    Args:
        logp: current log-probs [B, R] (with grad).
        old_logp: log-probs of the policy that sampled [B, R] (no grad).
        advantages: [B] (broadcast over tokens) or [B, R].
        clip_low: the ratio's lower clip is 1 - clip_low.
        clip_high: the ratio's upper clip is 1 + clip_high.
        dual_clip: the cap c > 1 for negative advantages; None disables it.

    Returns:
        (per-token loss [B, R], {"ratio", "clipped", "dual_clipped"} per-token tensors, no grad).

    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    info = {"ratio": ratio.detach(), "clipped": (loss_clipped > loss_unclipped).detach()}
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        cap = -advantages * dual_clip
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(dual, cap.expand_as(loss), loss)
        info["dual_clipped"] = dual.detach()
    else:
        info["dual_clipped"] = torch.zeros_like(info["clipped"])
    return loss, info


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): exp(ref - logp) - (ref - logp) - 1 >= 0."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0
