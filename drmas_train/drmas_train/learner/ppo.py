"""The PPO learner: one `Learner` per model, updating it from `CallRecord`s with advantages filled.

Choices stated once:
- Loss: PPO clipped ratio (1 - 0.2, 1 + 0.2) with dual clip c = 3 on negative advantages, including
  tokens of zero-advantage calls (`skip_zero_advantage` leaves those calls out of the passes: the same
  gradient while no KL or entropy term is on). `loss_agg` "token_mean" (the default): a token-mean over every
  response token of the update (mini-)batch, exact under gradient accumulation and data parallelism
  (each micro-batch's token-loss sum is divided by the token count of the whole mini-batch).
  "micro_token_mean" (verl, the reference's): each micro-batch's own token-mean, averaged over the
  mini-batch's micro-batches (`loss_denominator`).
- Old log-probs ("recompute", the default, as in the verl reference): the learner's own log-probs
  before the update. With one epoch and one mini-batch (the paper's setting) the policy has not
  moved yet, so they equal the current log-probs detached and no extra forward pass is needed;
  otherwise a no-grad pass computes them first. "sampled" uses the records' sampling log-probs, so
  the ratio also corrects a sampler/learner mismatch (e.g. a bf16 vLLM engine).
  "decoupled" (for asynchronous runs, `rollout.max_staleness` >= 1; AReaL's decoupled PPO): the ratio
  against the pre-update log-probs (the proximal policy), each token's loss weighted by
  pi_prox / pi_behaviour from the records' sampling log-probs (`loss.behaviour_weights`).
- Temperature: every call is scored under softmax(logits / T) at its own sampling temperature T
  (`CallRecord.score_temperature`; 1 for greedy calls), as the reference (verl) divides the logits by
  the rollout temperature: log-probs, old and reference log-probs and entropy alike. Agents with
  different temperatures may share a model and a micro-batch. (There is no learner temperature knob.)
- Forward (`forward`): plain padded rows, or a micro-batch packed as a prefix tree so that shared
  prompt prefixes run once (exact); the LM head runs on response positions only, in chunks. Entropy
  is computed in the update passes (it is logged), with gradient only when it is in the loss.
- Dropout off (eval mode) during the learner's forward passes, so recomputed log-probs are those
  of the policy that sampled; gradient checkpointing, when on, needs train mode (HF) instead.
- Optimizer: AdamW (0.9, 0.999), weight decay 0.01, lr 1e-6, one per model; param groups allow a
  per-agent lr (own model or own LoRA adapter). Gradient clipping at 1.0 on the global norm.
- The pre-clip global gradient norm is returned every optimizer step as `grad_norm` (the stability
  metric). A non-finite norm skips the step: no optimizer update, gradients zeroed, `skipped` = 1.
- Precision (`compute_dtype`): fp32, or bf16 matmuls under autocast over fp32 master weights, the
  log-softmax kept fp32 and the LM head too unless `head_dtype` is "compute" (`precision`); the bf16
  copies of the weights are cast once per optimizer step, not per micro-batch (`keep_casts`, unsharded).
- Compilation (`compile_layers`): the decoder layers run torch.compile'd inside the learner's passes
  only (`compiled`); the module tree is unchanged outside them.
- Data parallelism (`dp`): alone, replicated or FSDP-sharded ranks (`parallel`); the step below is
  the same code for all three.
- Which records share a rank, a mini-batch and a micro-batch (`batch_layout`): packed, or verl's
  arithmetic (reference), with the micro-batches' divisors (`layout`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from drmas_train.algorithm.records import CallRecord
from drmas_train.config import PPOConfig
from drmas_train.learner.adapters import adapter_of, chunk_by_adapter, lora_param_groups, named_group_norms
from drmas_train.learner.compiled import CompiledLayers
from drmas_train.learner.distributed import DataParallel, decoder_layers, full_tensor
from drmas_train.learner.forward import Scores, score
from drmas_train.learner.layout import MiniBatch, loss_denominator, packed_minibatches, reference_minibatches
from drmas_train.learner.loss import behaviour_weights, kl_k3, ppo_token_losses
from drmas_train.learner.metrics import UpdateMetrics
from drmas_train.learner.parallel import Alone, is_fsdp, make_strategy
from drmas_train.learner.precision import carry_residual_in, compute_in, keep_casts, resolve_compute_dtype

log = logging.getLogger(__name__)

__all__ = ["Learner", "PPOConfig", "loss_denominator", "lora_param_groups"]


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
        dp: this process's data-parallel group, when the model trains on several ranks (None: alone;
            it may also be set later). With the "fsdp" strategy, `model` must already be sharded
            (`distributed.shard_module`) and `param_groups` taken from the sharded model; `state_dict`
            and `load_state_dict` are then collectives (every rank must call them at once).

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
        self.config = cfg = config or PPOConfig()
        self.name = name
        self.pad_token_id = pad_token_id
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
            if is_fsdp(model):  # FSDP forbids deepcopy; a sharded reference must be built before sharding
                raise ValueError("kl_coef > 0 under FSDP needs ref_model (e.g. a copy taken before shard_module)")
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.compiled: CompiledLayers | None = None
        if cfg.compile_layers:
            if is_fsdp(model):
                raise ValueError("learner.compile_layers is not supported with FSDP sharding")
            self.compiled = CompiledLayers(model)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.device_type = self.params[0].device.type
        self.autocast = resolve_compute_dtype(
            cfg.compute_dtype, device_type=self.device_type, weights=self.params[0].dtype
        )
        if cfg.residual_dtype == "compute" and self.autocast is not None:
            carry_residual_in(model, self.autocast, decoder_layers(model))
        vocab = getattr(model.config, "vocab_size", None) or model.get_output_embeddings().weight.shape[0]
        self.chunk_tokens = max(1, int(cfg.logits_chunk_mib * 2**20 // (4 * vocab)))
        self.steps = 0  # optimizer steps taken or skipped
        self.optimizer_moves: list[tuple[str, int]] = []
        """Each move of the optimizer state under `optimizer_offload`: ("in" | "out", tensors moved)."""
        self._dp: DataParallel | None = None
        self.strategy = Alone()
        if dp is not None:
            self.dp = dp

    @property
    def dp(self) -> DataParallel | None:
        """The data-parallel group of this process (None: alone); setting it picks the strategy."""
        return self._dp

    @dp.setter
    def dp(self, dp: DataParallel | None) -> None:
        if dp is not self._dp:
            self._dp = dp
            self.strategy = make_strategy(dp, self.model, self.params)

    @property
    def sharded(self) -> bool:
        """Whether the model trains under FSDP."""
        return self.strategy.sharded

    # ---- the update -----------------------------------------------------------------------------
    def update(self, records: Sequence[CallRecord]) -> dict[str, float]:
        """Run `ppo_epochs` x `mini_batches` optimizer steps on the records; return metrics.

        Records with an empty response carry no tokens and are not trained (under `batch_layout`
        reference they keep their places in the layout).

        Returns:
            grad_norm (pre-clip, max over this update's optimizer steps), grad_norm/<group> for
            named param groups, loss, pg_loss, entropy, kl (when on), clip_frac, dual_clip_frac,
            ratio_mean, ratio_max (token-weighted over the update), sampler_kl (with recomputed old
            log-probs: how far the engine's sampling distribution is from the learner's, per token),
            n_tokens, n_samples, n_opt_steps, skipped (the number of skipped optimizer steps),
            zero_adv_skipped (calls left out for a zero advantage, `skip_zero_advantage`).

        """
        cfg = self.config
        records = self._kept(records)
        metrics = UpdateMetrics()
        n_samples = sum(1 for r in records if r.response_ids)
        if not n_samples:
            return metrics.result(n_samples=0)
        with self._learning(), self._optimizer_on_device():
            old: dict[int, torch.Tensor] = {}
            if cfg.old_logprobs != "sampled" and not (cfg.ppo_epochs == 1 and cfg.mini_batches == 1):
                old = self._recompute_old(records)  # the policy moves within this update
            rng = np.random.default_rng(cfg.seed + self.steps)
            for _ in range(cfg.ppo_epochs):
                for mini in self._minibatches(records, rng):
                    if any(mini.chunks):
                        self._accumulate(records, mini, old, metrics)
                        metrics.add_step(*self._clip_and_step())
        self.strategy.reduce(metrics, self.params[0].device)
        return metrics.result(n_samples=n_samples)

    def compute_gradients(self, records: Sequence[CallRecord]) -> dict[str, float]:
        """Fill `.grad` with the gradient of the token-mean loss over all records; no optimizer step.

        For inspection and tests: the same computation `update` does before its (single) step (under
        `batch_layout` reference: with one mini-batch per rank).
        """
        records = self._kept(records)
        metrics = UpdateMetrics()
        with self._learning():
            (mini,) = self._minibatches(records, None, whole=True)
            self._accumulate(records, mini, {}, metrics)
        self.strategy.reduce(metrics, self.params[0].device)
        return metrics.result(n_samples=sum(1 for r in records if r.response_ids))

    def _kept(self, records: Sequence[CallRecord]) -> list[CallRecord]:
        """The records an update lays out: all under `batch_layout` reference, else those with a response."""
        return [r for r in records if self.config.batch_layout == "reference" or len(r.response_ids) > 0]

    def _minibatches(self, records, rng, *, whole: bool = False) -> list[MiniBatch]:
        """One epoch's mini-batches under `batch_layout` (`layout`); `whole`: one mini-batch (per rank)."""
        if self.config.batch_layout == "reference":
            world = 1 if self.dp is None else self.dp.world_size
            return reference_minibatches(records, self.config, world, whole=whole)
        return packed_minibatches(records, self.config, rng, whole=whole)

    def _accumulate(self, records, mini: MiniBatch, old, metrics: UpdateMetrics) -> None:
        """Accumulate the loss gradient of one mini-batch (`loss_agg`) over this rank's passes."""
        n_tokens = sum(len(records[i].response_ids) for chunk in mini.chunks for i in chunk)
        self.optimizer.zero_grad(set_to_none=True)
        skip = self._skips_zero_advantage()
        self.strategy.begin()
        with self._casts_kept():
            for chunk, real in self.strategy.passes(mini.chunks):
                if not chunk:  # every record token-less: nothing to learn, but FSDP needs the pass
                    if not self.sharded:
                        continue
                    chunk, real = next(c for c in mini.chunks if c), False
                micro_tokens = sum(len(records[i].response_ids) for i in chunk)
                denominator = loss_denominator(self.config.loss_agg, micro_tokens, n_tokens, mini.n_micro)
                if skip:  # the denominator above still counts the skipped calls' tokens
                    trained = [i for i in chunk if records[i].advantage != 0]
                    metrics.skipped_calls += len(chunk) - len(trained)
                    if not (chunk := trained):
                        continue
                self._micro_step(records, chunk, old, denominator, metrics if real else None)
        self.strategy.finish(self.params)

    def _skips_zero_advantage(self) -> bool:
        """Whether zero-advantage calls can be left out of this update exactly (`skip_zero_advantage`)."""
        cfg = self.config
        return cfg.skip_zero_advantage and not self.sharded and cfg.kl_coef == 0 and cfg.entropy_coef == 0

    def _micro_step(self, records, chunk, old, denominator: float, metrics: UpdateMetrics | None) -> None:
        """Forward and backward of one micro-batch; `metrics` None: a zero-weight pass (no gradient, no metrics).

        A zero-weight pass runs exactly the collectives of a real one (FSDP all-gathers in every
        forward, including the reference model's, and reduce-scatters in every backward).
        """
        cfg = self.config
        micro = [records[i] for i in chunk]
        self._activate(micro[0])
        out = self._score(self.model, micro, entropy="loss" if cfg.entropy_coef > 0 else "metric")
        logp = out.logp
        if cfg.old_logprobs == "sampled":
            old_logp = _sampled_logprobs(micro, logp.shape, logp.device)
        elif old:
            old_logp = torch.zeros_like(logp)
            for row, i in enumerate(chunk):
                t = old[i]
                old_logp[row, : len(t)] = t
        else:
            old_logp = logp.detach()
        adv = torch.tensor([r.advantage for r in micro], dtype=torch.float32, device=logp.device)
        pg, info = ppo_token_losses(
            logp, old_logp, adv, clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip
        )
        if cfg.old_logprobs == "decoupled":  # old_logp is the proximal policy's; weight by prox / behaviour
            behaviour = _sampled_logprobs(micro, logp.shape, logp.device)
            pg = pg * behaviour_weights(old_logp, behaviour, out.mask, cfg.behaviour_weight_cap)
        loss, kl = pg, None
        if cfg.kl_coef > 0:
            kl = kl_k3(logp, self._ref_logprobs(micro))
            loss = loss + cfg.kl_coef * kl
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * out.entropy
        maskf = out.mask.float()
        total = (loss * maskf).sum() / denominator
        if metrics is None:
            total = total * 0.0
        total.backward()
        if metrics is not None:
            gap = _sampler_kl(micro, old_logp, out.mask) if cfg.old_logprobs != "sampled" else None
            metrics.add_tokens(maskf, loss=loss, pg=pg, ent=out.entropy, kl=kl, info=info, sampler_kl=gap)

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

    @contextmanager
    def _optimizer_on_device(self) -> Iterator[None]:
        """Under `optimizer_offload`: the optimizer state on the parameters' device for the block only."""
        if not self.config.optimizer_offload:
            yield
            return
        self._move_optimizer_state(to_host=False)
        try:
            yield
        finally:
            self._move_optimizer_state(to_host=True)

    def _move_optimizer_state(self, *, to_host: bool) -> None:
        """Copy every state tensor to the host (or back to its parameter's device), as verl's offload does.

        A copy even where source and target are one device (a CPU-only machine), so the move is real there
        too. AdamW's `step` counters stay where they are (host scalars unless `capturable`). No pinned
        memory: the copies are synchronous.
        """
        moved = 0
        for param, state in self.optimizer.state.items():
            device = torch.device("cpu") if to_host else param.device
            for key, value in state.items():
                if torch.is_tensor(value) and key != "step":
                    state[key] = value.to(device, copy=True)
                    moved += 1
        self.optimizer_moves.append(("out" if to_host else "in", moved))

    # ---- forward passes -------------------------------------------------------------------------
    @contextmanager
    def _learning(self) -> Iterator[None]:
        """Eval mode (dropout off) for the learner's passes; train mode when checkpointing needs it."""
        was_training = self.model.training
        self.model.train(self.config.gradient_checkpointing)
        try:
            with self.compiled.active() if self.compiled else nullcontext():
                yield
        finally:
            self.model.train(was_training)

    def _casts_kept(self) -> contextlib.AbstractContextManager[None]:
        """`keep_casts` over the block, except under FSDP (its gathered weights are freed after each use)."""
        return keep_casts(None if self.sharded else self.autocast, self.device_type)

    def _logprob_batches(self, records: Sequence[CallRecord]) -> list[list[int]]:
        """No-grad passes of `logprob_micro_batch_size` records with a response, one adapter each.

        Records sharing prefixes go together unless forward is plain.
        """
        cfg = self.config
        size = cfg.logprob_micro_batch_size or cfg.micro_batch_size
        kept = [i for i, r in enumerate(records) if r.response_ids]
        return chunk_by_adapter(records, kept, size, by_prefix=cfg.forward != "plain")

    def _score(self, model: torch.nn.Module, records: Sequence[CallRecord], *, entropy: str = "off") -> Scores:
        with compute_in(self.autocast, self.device_type):
            return score(
                model,
                records,
                pad_token_id=self.pad_token_id,
                forward=self.config.forward,
                entropy=entropy,
                chunk_tokens=self.chunk_tokens,
                tree_multiple=self.config.tree_multiple,
                head_dtype=self.config.head_dtype,
            )

    @torch.no_grad()
    def _ref_logprobs(self, records: Sequence[CallRecord]) -> torch.Tensor:
        """Reference-model log-probs for the KL term."""
        if self.ref_model is not None:
            return self._score(self.ref_model, records).logp
        with self.model.disable_adapter():  # peft: the frozen base is the reference
            return self._score(self.model, records).logp

    @torch.no_grad()
    def _recompute_old(self, records: Sequence[CallRecord]) -> dict[int, torch.Tensor]:
        """Pre-update log-probs per record index (needed when the policy moves within one update).

        Every rank computes every record (no sharding), so under FSDP all ranks run the same passes.
        """
        out: dict[int, torch.Tensor] = {}
        with self._casts_kept():
            for idx in self._logprob_batches(records):
                self._activate(records[idx[0]])
                scores = self._score(self.model, [records[i] for i in idx])
                for row, i in enumerate(idx):
                    out[i] = scores.logp[row, : len(records[i].response_ids)].clone()
        return out

    @torch.no_grad()
    def logprobs(self, records: Sequence[CallRecord]) -> list[torch.Tensor]:
        """The current policy's log-probs of each record's response tokens, as the loss sees them.

        Each record is scored under softmax(logits / T) at its `score_temperature`, so on-policy
        these equal the engine's sampling log-probs (`CallRecord.logprobs`).
        """
        with self._learning():
            old = self._recompute_old(records)
        return [old.get(i, torch.zeros(0)) for i in range(len(records))]

    def _activate(self, record: CallRecord) -> None:
        """Activate the record's LoRA adapter (peft) for the next forward pass."""
        name = adapter_of(record)
        if name is not None and hasattr(self.model, "set_adapter"):
            self.model.set_adapter(name)
            self.strategy.adapter_switched(self.params)

    # ---- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Optimizer state and counters (the model's weights are saved by the caller), in the one-process format."""
        optimizer = self.strategy.optimizer_state(self.optimizer)
        return {"optimizer": optimizer, "steps": self.steps, "config": asdict(self.config)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved (under FSDP every rank gets the same whole state)."""
        self.strategy.load_optimizer_state(self.optimizer, state["optimizer"])
        self.steps = int(state["steps"])
        if self.config.optimizer_offload:  # loaded onto the parameters' device: to the host until the next update
            self._move_optimizer_state(to_host=True)


def _sampler_kl(records: Sequence[CallRecord], old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
    """Per-token k3 estimate of KL(sampler || learner) on the sampled tokens, or None without sampling log-probs.

    About zero when the engine and the learner compute the same distribution (fp32 on both); a bf16 engine
    (`models.gen_dtype`) makes it positive. verl logs the same gap as a probability difference
    (`training/rollout_probs_diff_mean`).
    """
    if any(len(r.logprobs) != len(r.response_ids) for r in records):
        return None
    sampled = _sampled_logprobs(records, old_logp.shape, old_logp.device)
    return kl_k3(sampled, torch.where(mask, old_logp.detach(), sampled))


def _sampled_logprobs(records: Sequence[CallRecord], shape: torch.Size, device) -> torch.Tensor:
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
