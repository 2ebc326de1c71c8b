"""Pure tensor functions of the PPO learner: the padded batch layout, the dual-clip loss, k3 KL.

Log-probs and entropy are computed by the forward strategies (`forward`).

Shapes: B sequences, R = the longest response in the batch; `mask[b, t]` marks real response tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class Batch:
    """Prompts left-padded to P, responses right-padded to R: every response starts at column P.

    That layout puts every row's response-predicting positions in the same columns (P - 1 .. P + R - 2),
    so the forward gathers them for the LM head with one index (`forward.score`).
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


def behaviour_weights(
    prox_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, cap: float | None
) -> torch.Tensor:
    """Decoupled PPO's per-token weights pi_prox / pi_behaviour [B, R] (no grad; 0 off the mask and above `cap`).

    The PPO loss of a token sampled by an older (behaviour) policy is clipped against the proximal policy
    and weighted by this ratio (Hilton et al. 2022; AReaL's asynchronous PPO), so stale samples are
    importance-corrected without letting the clip range follow the behaviour policy.
    """
    diff = torch.where(mask, prox_logp.detach() - behaviour_logp, 0.0)
    weights = torch.exp(diff)
    if cap is not None:
        weights = torch.where(weights > cap, 0.0, weights)
    return torch.where(mask, weights, 0.0)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): exp(ref - logp) - (ref - logp) - 1 >= 0."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0
