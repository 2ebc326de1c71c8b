"""The PPO learner: one `Learner` per model, updating it from `CallRecord`s with advantages filled.

Choices stated once:
- Loss: PPO clipped ratio (1 - 0.2, 1 + 0.2) with dual clip c = 3 on negative advantages, token-mean
  over every response token of the update (mini-)batch, including tokens of zero-advantage calls.
  Token-mean is exact under gradient accumulation: each micro-batch's token-loss sum is divided by
  the token count of the whole mini-batch, not of the micro-batch.
- Old log-probs ("recompute", the default, as in the verl reference): the learner's own log-probs
  before the update. With one epoch and one mini-batch (the paper's setting) the policy has not
  moved yet, so they equal the current log-probs detached and no extra forward pass is needed;
  otherwise a no-grad pass computes them first. "sampled" uses the records' sampling log-probs, so
  the ratio also corrects a sampler/learner mismatch (e.g. a bf16 vLLM engine).
- Dropout off (eval mode) during the learner's forward passes, so recomputed log-probs are those
  of the policy that sampled; gradient checkpointing, when on, needs train mode (HF) instead.
- Optimizer: AdamW (0.9, 0.999), weight decay 0.01, lr 1e-6, one per model; param groups allow a
  per-agent lr (own model or own LoRA adapter). Gradient clipping at 1.0 on the global norm.
- The pre-clip global gradient norm is returned every optimizer step as `grad_norm` (the stability
  metric). A non-finite norm skips the step: no optimizer update, gradients zeroed, `skipped` = 1.
- Data-parallel (`dp`, see `distributed`): every rank gets the same records, computes its share of
  the micro-batches, and the summed gradients equal the one-process gradient; metrics are summed
  over the ranks, so every rank returns the same numbers.
- FSDP (`dp.strategy == "fsdp"`, model sharded with `distributed.shard_module` before the learner
  is built): every forward and backward is a collective, so every rank runs as many passes as the
  largest share, padding with zero-weight passes (gradient unchanged, no metrics); FSDP
  reduce-scatters the gradients itself, and norms are gathered whole. `state_dict` and
  `load_state_dict` are then collectives too (every rank must call them at once).
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from drmas_train.distributed import (
    DataParallel,
    UsedParams,
    full_optimizer_state,
    full_tensor,
    load_sharded_optimizer_state,
)
from drmas_train.learner_utils import adapter_of, chunk_by_adapter, lora_param_groups, named_group_norms
from drmas_train.loss import entropy_from_logits, kl_k3, make_batch, ppo_token_losses, response_logits, token_logprobs
from drmas_train.records import CallRecord

log = logging.getLogger(__name__)

__all__ = ["Learner", "PPOConfig", "lora_param_groups"]


@dataclass
class PPOConfig:
    """Optimisation knobs of one model's learner (paper values are the defaults unless noted)."""

    lr: float = 1e-6
    """AdamW learning rate, constant. Paper: 1e-6 for every agent; per-agent overrides go in param groups."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas. Paper: (0.9, 0.999)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay. Paper: 0.01."""
    adam_eps: float = 1e-8
    """AdamW epsilon (torch default)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; the pre-clip norm is what gets logged. Paper: 1.0."""
    clip_low: float = 0.2
    """PPO lower ratio clip (1 - clip_low). Paper: 0.2."""
    clip_high: float = 0.2
    """PPO upper ratio clip (1 + clip_high); raise it (e.g. 0.28, DAPO) to let rare tokens grow. Paper: 0.2."""
    dual_clip: float | None = 3.0
    """Dual-clip cap c on negative advantages: bounds the loss of tokens whose ratio exploded. Paper: 3.0; None off."""
    kl_coef: float = 0.0
    """k3 KL-to-reference loss coefficient. Paper: 0 (off: no reference model is held in memory)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (loss -= coef * token-mean entropy). Paper: 0 for math, 0.001 for search."""
    ppo_epochs: int = 1
    """Passes over the rollout batch per step. Paper: 1 (strictly on-policy; the ratio is then exactly 1)."""
    mini_batches: int = 1
    """Optimizer steps per epoch (the batch is shuffled and split). Paper: 1."""
    micro_batch_size: int = 4
    """Sequences per forward/backward; lower it to save memory. Gradients are exact whatever its value."""
    old_logprobs: str = "recompute"
    """"recompute" (learner's own pre-update log-probs, as verl) or "sampled" (the records' sampling log-probs)."""
    temperature: float = 1.0
    """Temperature of the learner's log-probs; 1 matches the backends' raw-distribution log-probs."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward: about 30% slower, much less memory on long contexts."""
    seed: int = 0
    """Seeds the mini-batch shuffle (only used when mini_batches > 1)."""

    def __post_init__(self) -> None:
        if self.old_logprobs not in ("recompute", "sampled"):
            raise ValueError(f"old_logprobs must be 'recompute' or 'sampled', got {self.old_logprobs!r}")
        if self.ppo_epochs < 1 or self.mini_batches < 1 or self.micro_batch_size < 1:
            raise ValueError("ppo_epochs, mini_batches and micro_batch_size must be >= 1")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {self.clip_low}, {self.clip_high}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        if self.grad_clip <= 0 or self.temperature <= 0 or self.kl_coef < 0 or self.entropy_coef < 0:
            raise ValueError("grad_clip and temperature must be > 0; kl_coef and entropy_coef >= 0")
        self.betas = tuple(self.betas)  # YAML gives lists


class Learner:
    """Updates one model (and its LoRA adapters, if any) with PPO from call records.

    Args:
        model: a causal LM (transformers or a peft model); trained in place.
        config: the optimisation knobs.
        name: the model's name, for logs.
        param_groups: optimizer param groups, e.g. one per agent's LoRA adapter with its own "lr";
            a group's optional "name" key adds `grad_norm/<name>` to the metrics. Default: all
            parameters that require grad, at `config.lr`.
        ref_model: the frozen reference for the KL term; when `kl_coef > 0` and None, the base
            model with adapters disabled (peft) or a frozen copy of `model` taken now.
        pad_token_id: the id used for padding (its value never matters: padded positions are masked).
        dp: this process's data-parallel group, when the model trains on several ranks (None: alone).
            With the "fsdp" strategy, `model` must already be sharded (`distributed.shard_module`)
            and `param_groups` taken from the sharded model.

    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: PPOConfig | None = None,
        *,
        name: str = "policy",
        param_groups: Sequence[dict[str, Any]] | None = None,
        ref_model: torch.nn.Module | None = None,
        pad_token_id: int = 0,
        dp: DataParallel | None = None,
    ) -> None:
        self.model = model
        self.dp = dp
        self.config = config or PPOConfig()
        self.name = name
        self.pad_token_id = pad_token_id
        cfg = self.config
        if param_groups is None:
            param_groups = [{"params": [p for p in model.parameters() if p.requires_grad]}]
        self.param_groups = [dict(g, params=list(g["params"])) for g in param_groups]
        self.params = [p for g in self.param_groups for p in g["params"]]
        if not self.params:
            raise ValueError(f"model {name!r} has no trainable parameters")
        opt_groups = [{k: v for k, v in g.items() if k != "name"} for g in self.param_groups]
        self.optimizer = torch.optim.AdamW(
            opt_groups, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, eps=cfg.adam_eps
        )
        self.ref_model = ref_model
        if cfg.kl_coef > 0 and ref_model is None and not hasattr(model, "disable_adapter"):
            if _is_fsdp(model):  # FSDP forbids deepcopy; a sharded reference must be built before sharding
                raise ValueError("kl_coef > 0 under FSDP needs ref_model (e.g. a copy taken before shard_module)")
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.steps = 0  # optimizer steps taken or skipped
        self._used: UsedParams | None = None  # FSDP only, built on first use (`dp` may be set later)
        if self.sharded:
            self._used_params()

    @property
    def sharded(self) -> bool:
        """Whether the model trains under FSDP (`dp` may be attached after construction)."""
        return self.dp is not None and self.dp.sharded

    def _used_params(self) -> UsedParams:
        """FSDP: the tracker of parameter use, after checking that the optimizer holds the shards."""
        if self._used is None:
            _check_sharded(self.model, self.params)
            # FSDP gives unused parameters zero gradients: track use to restore one process's None.
            self._used = UsedParams(self.model, self.params)
        return self._used

    # ---- forward passes -------------------------------------------------------------------------
    def _batch(self, records: Sequence[CallRecord], model: torch.nn.Module):
        """The records' exact ids, padded, on `model`'s device."""
        prompts = [r.prompt_ids for r in records]
        responses = [r.response_ids for r in records]
        return make_batch(prompts, responses, pad_token_id=self.pad_token_id, device=next(model.parameters()).device)

    def _forward(self, records: Sequence[CallRecord], *, with_entropy: bool) -> tuple:
        """Log-probs [B, R] (with grad), entropy or None, and the response mask for one micro-batch."""
        batch = self._batch(records, self.model)
        logits = response_logits(self.model, batch)
        logp = token_logprobs(logits, batch.response_ids, temperature=self.config.temperature)
        ent = None
        if with_entropy:  # with grad only when it is in the loss: saves a [B, R, V] tensor for backward
            with torch.set_grad_enabled(torch.is_grad_enabled() and self.config.entropy_coef > 0):
                ent = entropy_from_logits(logits, temperature=self.config.temperature)
        return logp, ent, batch.response_mask

    @torch.no_grad()
    def _ref_logprobs(self, records: Sequence[CallRecord]) -> torch.Tensor:
        """Reference-model log-probs for the KL term."""
        if self.ref_model is not None:
            batch = self._batch(records, self.ref_model)
            logits = response_logits(self.ref_model, batch)
            return token_logprobs(logits, batch.response_ids, temperature=self.config.temperature)
        with self.model.disable_adapter():  # peft: the frozen base is the reference
            return self._forward(records, with_entropy=False)[0]

    def _old_logprobs(self, records: Sequence[CallRecord], shape: torch.Size, device) -> torch.Tensor:
        """The records' sampling log-probs, right-padded to `shape`."""
        out = torch.zeros(shape, dtype=torch.float32, device=device)
        for i, r in enumerate(records):
            if len(r.logprobs) != len(r.response_ids):
                raise ValueError(
                    f"record (episode {r.episode_id}, agent {r.agent}, turn {r.turn}) has {len(r.logprobs)} "
                    f"log-probs for {len(r.response_ids)} response tokens"
                )
            out[i, : len(r.logprobs)] = torch.as_tensor(r.logprobs, dtype=torch.float32)
        return out

    # ---- the update -----------------------------------------------------------------------------
    def update(self, records: Sequence[CallRecord]) -> dict[str, float]:
        """Run `ppo_epochs` x `mini_batches` optimizer steps on the records; return metrics.

        Records with an empty response carry no tokens and are ignored.

        Returns:
            grad_norm (pre-clip, max over this update's optimizer steps), grad_norm/<group> for
            named param groups, loss, pg_loss, entropy, kl (when on), clip_frac, dual_clip_frac,
            ratio_mean, ratio_max (token-weighted over the update), n_tokens, n_samples,
            n_opt_steps, skipped (the number of skipped optimizer steps).

        """
        cfg = self.config
        records = [r for r in records if len(r.response_ids) > 0]
        acc = _Accumulator()
        if not records:
            return acc.result(n_samples=0)
        was_training = self.model.training
        self.model.train(cfg.gradient_checkpointing)
        try:
            single_pass = cfg.ppo_epochs == 1 and cfg.mini_batches == 1
            old: dict[int, torch.Tensor] = {}
            if cfg.old_logprobs == "recompute" and not single_pass:
                old = self._recompute_old(records)
            rng = np.random.default_rng(cfg.seed + self.steps)
            for _ in range(cfg.ppo_epochs):
                order = rng.permutation(len(records)) if cfg.mini_batches > 1 else np.arange(len(records))
                for mb in np.array_split(order, min(cfg.mini_batches, len(records))):
                    self._optimizer_step([records[i] for i in mb], [int(i) for i in mb], old, acc)
        finally:
            self.model.train(was_training)
        return acc.result(n_samples=len(records), dp=self.dp, device=self.params[0].device)

    @torch.no_grad()
    def _recompute_old(self, records: Sequence[CallRecord]) -> dict[int, torch.Tensor]:
        """Pre-update log-probs per record index (needed when the policy moves within one update).

        Every rank computes every record (no sharding), so under FSDP all ranks run the same passes.
        """
        out: dict[int, torch.Tensor] = {}
        for idx in chunk_by_adapter(records, range(len(records)), self.config.micro_batch_size):
            self._activate(records[idx[0]])
            logp, _, mask = self._forward([records[i] for i in idx], with_entropy=False)
            for row, i in enumerate(idx):
                out[i] = logp[row, : int(mask[row].sum())].clone()
        return out

    def _activate(self, record: CallRecord) -> None:
        """Activate the record's LoRA adapter (peft) for the next forward pass."""
        name = adapter_of(record)
        if name is not None and hasattr(self.model, "set_adapter"):
            self.model.set_adapter(name)
            if self.sharded:
                # peft freezes the other adapters; FSDP reduce-scatters only parameters that require
                # grad, so ranks on different adapters would reduce-scatter different tensors.
                for p in self.params:
                    p.requires_grad_(True)

    def compute_gradients(self, records: Sequence[CallRecord]) -> dict[str, float]:
        """Fill `.grad` with the gradient of the token-mean loss over all records; no optimizer step.

        For inspection and tests: the same computation `update` does before its (single) step.
        """
        records = [r for r in records if len(r.response_ids) > 0]
        acc = _Accumulator()
        was_training = self.model.training
        self.model.train(self.config.gradient_checkpointing)
        try:
            self._accumulate(records, list(range(len(records))), {}, acc)
        finally:
            self.model.train(was_training)
        return acc.result(n_samples=len(records), dp=self.dp, device=self.params[0].device)

    def _optimizer_step(self, records, indices, old, acc: _Accumulator) -> None:
        """One optimizer step on one mini-batch: accumulate gradients, clip, step (or skip)."""
        self._accumulate(records, indices, old, acc)
        norm, group_norms = self._clip_and_step()
        acc.add_step(norm, group_norms)

    def _accumulate(self, records, indices, old, acc: _Accumulator) -> None:
        """Accumulate the token-mean loss gradient of one mini-batch over its micro-batches."""
        n_tokens = sum(len(r.response_ids) for r in records)
        self.optimizer.zero_grad(set_to_none=True)
        chunks = chunk_by_adapter(records, range(len(records)), self.config.micro_batch_size)
        if self.sharded:
            self._accumulate_sharded(records, chunks, indices, old, n_tokens, acc)
            return
        for chunk in self.dp.shard(chunks) if self.dp else chunks:
            self._micro_step(records, chunk, indices, old, n_tokens, acc)
        if self.dp:
            self.dp.all_reduce_grads(self.params)

    def _accumulate_sharded(self, records, chunks, indices, old, n_tokens: int, acc: _Accumulator) -> None:
        """FSDP: this rank's micro-batches, padded with zero-weight passes to the largest share."""
        used = self._used_params()
        mine = self.dp.shard(chunks)
        passes = -(-len(chunks) // self.dp.world_size)  # rank 0's share, the largest
        used.reset()
        for chunk in mine:
            self._micro_step(records, chunk, indices, old, n_tokens, acc)
        # chunks[0] is computed for real by rank 0, so the padding uses no parameter it does not.
        for _ in range(passes - len(mine)):
            self._micro_step(records, chunks[0], indices, old, n_tokens, None)
        used.drop_unused_grads(self.params, self.dp)

    def _micro_step(self, records, chunk, indices, old, n_tokens: int, acc: _Accumulator | None) -> None:
        """Forward and backward of one micro-batch; `acc` None: a zero-weight pass (no gradient, no metrics).

        A zero-weight pass runs exactly the collectives of a real one (FSDP all-gathers in every
        forward, including the reference model's, and reduce-scatters in every backward).
        """
        cfg = self.config
        micro = [records[i] for i in chunk]
        self._activate(micro[0])
        logp, ent, mask = self._forward(micro, with_entropy=True)
        if cfg.old_logprobs == "sampled":
            old_logp = self._old_logprobs(micro, logp.shape, logp.device)
        elif old:
            old_logp = torch.zeros_like(logp)
            for row, i in enumerate(chunk):
                t = old[indices[i]]
                old_logp[row, : len(t)] = t
        else:
            old_logp = logp.detach()
        adv = torch.tensor([r.advantage for r in micro], dtype=torch.float32, device=logp.device)
        pg, info = ppo_token_losses(
            logp, old_logp, adv, clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip
        )
        maskf = mask.float()
        loss = pg
        kl = None
        if cfg.kl_coef > 0:
            kl = kl_k3(logp, self._ref_logprobs(micro))
            loss = loss + cfg.kl_coef * kl
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * ent
        # Token-mean over the whole mini-batch: divide by its token count, not the micro-batch's.
        total = (loss * maskf).sum() / n_tokens
        if acc is None:
            total = total * 0.0
        total.backward()
        if acc is not None:
            acc.add_tokens(maskf, loss=loss, pg=pg, ent=ent, kl=kl, info=info)

    def _clip_and_step(self) -> tuple[float, dict[str, float]]:
        """Pre-clip global grad norm; skip the step when it is not finite."""
        self.steps += 1
        grads = [p.grad for p in self.params if p.grad is not None]
        group_norms = named_group_norms(self.param_groups)
        if not grads:
            return 0.0, group_norms
        # Under FSDP the grads are DTensor shards: the total is gathered whole (identity otherwise).
        norm = float(full_tensor(torch.nn.utils.get_total_norm(grads, norm_type=2.0)))
        if not math.isfinite(norm):
            log.warning("model %s: non-finite gradient norm (%s) at step %d: step skipped", self.name, norm, self.steps)
            self.optimizer.zero_grad(set_to_none=True)
            return norm, group_norms
        torch.nn.utils.clip_grads_with_norm_(grads, self.config.grad_clip, torch.tensor(norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm, group_norms

    # ---- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Optimizer state and counters (the model's weights are saved by the caller).

        Under FSDP a collective: every rank must call it at once; each gets the whole state (CPU
        tensors), in the one-process format, so it loads with or without sharding.
        """
        optimizer = full_optimizer_state(self.optimizer) if self.sharded else self.optimizer.state_dict()
        return {"optimizer": optimizer, "steps": self.steps, "config": asdict(self.config)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved.

        Under FSDP every rank must be given the same whole state; each keeps its own shards.
        """
        if self.sharded:
            load_sharded_optimizer_state(self.optimizer, state["optimizer"])
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])


def _is_fsdp(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _check_sharded(model: torch.nn.Module, params: Sequence[torch.nn.Parameter]) -> None:
    """FSDP needs the model sharded before the optimizer takes its parameters (else they are stale)."""
    from torch.distributed.tensor import DTensor

    if not _is_fsdp(model) or not all(isinstance(p, DTensor) for p in params):
        raise ValueError(
            "the 'fsdp' strategy needs the model sharded (distributed.shard_module) before the Learner is built"
        )


_METRIC_KEYS = ("loss", "pg_loss", "entropy", "ratio_mean", "clip_frac", "dual_clip_frac", "kl")


class _Accumulator:
    """Token-weighted sums of per-token metrics and the per-step gradient norms of one update."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.tokens = 0
        self.ratio_max = float("-inf")
        self.norms: list[float] = []
        self.group_norms: dict[str, float] = {}
        self.skipped = 0

    def add_tokens(self, maskf, *, loss, pg, ent, kl, info) -> None:
        with torch.no_grad():
            parts = {"loss": loss, "pg_loss": pg, "entropy": ent, "ratio_mean": info["ratio"]}
            parts.update(clip_frac=info["clipped"], dual_clip_frac=info["dual_clipped"])
            if kl is not None:
                parts["kl"] = kl
            for key, val in parts.items():
                self.sums[key] = self.sums.get(key, 0.0) + float((val.float() * maskf).sum())
            self.tokens += int(maskf.sum())
            ratio = info["ratio"][maskf.bool()]
            if ratio.numel():
                self.ratio_max = max(self.ratio_max, float(ratio.max()))

    def add_step(self, norm: float, group_norms: dict[str, float]) -> None:
        self.norms.append(norm)
        self.skipped += int(not math.isfinite(norm))
        for k, v in group_norms.items():  # the largest over this update's steps, like grad_norm
            self.group_norms[k] = v if k not in self.group_norms else max(self.group_norms[k], v)

    def reduce(self, dp: DataParallel, device) -> None:
        """Sum the token-weighted sums and token counts over the ranks (the norms are already global)."""
        # A rank without micro-batches has no sums yet: reduce a fixed key list, with presence counts.
        keys = _METRIC_KEYS
        present = [float(k in self.sums) for k in keys]
        totals = dp.sum([self.sums.get(k, 0.0) for k in keys] + present + [float(self.tokens)], device)
        n = len(keys)
        self.sums = {k: totals[i] for i, k in enumerate(keys) if totals[n + i] > 0}
        self.tokens = int(totals[-1])
        self.ratio_max = dp.max(self.ratio_max, device)

    def result(self, *, n_samples: int, dp: DataParallel | None = None, device=None) -> dict[str, float]:
        if dp is not None:
            self.reduce(dp, device)
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
        return out
