"""The metrics of one learner update: token-weighted sums over micro-batches (and ranks), step norms."""

from __future__ import annotations

import math

import numpy as np
import torch

from drmas_train.learner.distributed import DataParallel

_METRIC_KEYS = ("loss", "pg_loss", "entropy", "ratio_mean", "clip_frac", "dual_clip_frac", "kl", "sampler_kl")


class UpdateMetrics:
    """Token-weighted sums of per-token metrics and the per-step gradient norms of one update."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.tokens = 0
        self.ratio_max = float("-inf")
        self.norms: list[float] = []
        self.group_norms: dict[str, float] = {}
        self.skipped = 0
        self.skipped_calls = 0
        """Calls left out of the passes for a zero advantage (`skip_zero_advantage`)."""

    def add_tokens(self, maskf, *, loss, pg, ent, kl, info, sampler_kl=None) -> None:
        """Add one micro-batch's per-token values ([B, R] each, `maskf` marking real tokens; None: not measured)."""
        with torch.no_grad():
            parts = {"loss": loss, "pg_loss": pg, "ratio_mean": info["ratio"]}
            parts.update(clip_frac=info["clipped"], dual_clip_frac=info["dual_clipped"])
            if ent is not None:
                parts["entropy"] = ent
            if kl is not None:
                parts["kl"] = kl
            if sampler_kl is not None:
                parts["sampler_kl"] = sampler_kl
            for key, val in parts.items():
                self.sums[key] = self.sums.get(key, 0.0) + float((val.float() * maskf).sum())
            self.tokens += int(maskf.sum())
            ratio = info["ratio"][maskf.bool()]
            if ratio.numel():
                self.ratio_max = max(self.ratio_max, float(ratio.max()))

    def add_step(self, norm: float, group_norms: dict[str, float]) -> None:
        """Add one optimizer step's pre-clip gradient norms (non-finite: a skipped step)."""
        self.norms.append(norm)
        self.skipped += int(not math.isfinite(norm))
        for k, v in group_norms.items():  # the largest over this update's steps, like grad_norm
            self.group_norms[k] = v if k not in self.group_norms else max(self.group_norms[k], v)

    def reduce(self, dp: DataParallel, device) -> None:
        """Sum the token-weighted sums and token counts over the ranks (the norms are already global)."""
        # A rank without micro-batches has no sums yet: reduce a fixed key list, with presence counts.
        keys = _METRIC_KEYS
        present = [float(k in self.sums) for k in keys]
        counts = [float(self.tokens), float(self.skipped_calls)]
        totals = dp.sum([self.sums.get(k, 0.0) for k in keys] + present + counts, device)
        n = len(keys)
        self.sums = {k: totals[i] for i, k in enumerate(keys) if totals[n + i] > 0}
        self.tokens, self.skipped_calls = int(totals[-2]), int(totals[-1])
        self.ratio_max = dp.max(self.ratio_max, device)

    def result(self, *, n_samples: int) -> dict[str, float]:
        """The update's metrics: token means, the largest step norm, counts (see `Learner.update`)."""
        denom = max(self.tokens, 1)
        out = {k: v / denom for k, v in self.sums.items()}
        finite = [n for n in self.norms if math.isfinite(n)]
        out["grad_norm"] = max(self.norms, key=lambda n: (not math.isfinite(n), n)) if self.norms else 0.0
        if len(finite) > 1:
            out["grad_norm_mean"] = float(np.mean(finite))
        out.update({f"grad_norm/{k}": v for k, v in self.group_norms.items()})
        out["ratio_max"] = self.ratio_max if self.tokens else 0.0
        out.update(n_tokens=float(self.tokens), n_samples=float(n_samples), n_opt_steps=float(len(self.norms)))
        out["skipped"] = float(self.skipped)
        out["zero_adv_skipped"] = float(self.skipped_calls)
        return out
