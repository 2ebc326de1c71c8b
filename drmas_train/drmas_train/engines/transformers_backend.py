"""The transformers policy backend: batched sampling with a KV cache, on CPU or GPU.

One backend serves one model (and, with LoRA, every agent's adapter on it). A batch may mix
sampling settings and adapters: temperature and top-p are applied per row, and peft's mixed-adapter
forward (`adapter_names=`) runs each row with its own adapter. Prompts are left-padded; position
ids are computed from the attention mask so padding does not shift positions.

Log-probs are those of the distribution each token was sampled from, read from the same logits:
softmax(logits / T) at the row's temperature T, renormalised over its top-p nucleus (the tail masked
after the temperature, as vLLM's sampler does), i.e. log p_T(token) - log(nucleus mass). A greedy row
ignores top-p and reports log softmax(logits) (T = 1). This is what the vLLM backend returns
(`logprobs_mode="processed_logprobs"`), so the two backends give the same behaviour log-probs. The
learner recomputes log p_T without top-p (as the reference's verl learner), so at top-p 1 the PPO ratio
is 1 on-policy; at top-p < 1 the ratio against these log-probs (`learner.old_logprobs` "sampled", the
behaviour weights of "decoupled", the `sampler_kl` metric) is the nucleus mass, below 1, on either
backend; "recompute" does not use them.

Shared prefill (`share_prefill`, on by default): GRPO samples every prompt `group_size` times, so a
batch holds each distinct (prompt, adapter) several times. Each distinct one is prefilled once and its
KV cache is copied to its rows before decoding (`DynamicCache.batch_select_indices`); decoding is
unchanged, so the outputs are the same in distribution (greedy outputs identical, tested). The
prefill also computes the last position's logits only (`logits_to_keep=1`).

Per-row sampling: every row draws its uniforms from a generator of its own, seeded with the row's
seed (`base.row_seeds`), and picks its token by inverting the CDF of its (tempered, top-p filtered)
distribution with one uniform per step. A row's tokens therefore depend on its own prompt, settings
and seed only, not on the other rows of its batch, its position, or how the batch was split (across
`max_batch_size` chunks or data-parallel ranks), up to float differences of the batched forward
(none observed with the tiny fp32 models of the tests). Greedy rows take the argmax, as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from drmas_train.engines.base import EngineAsleepError, Generation, SamplingParams, Seeds, row_seeds
from drmas_train.engines.nucleus import filter_top_p
from drmas_train.engines.sleep import ModuleSleep

BASE_ADAPTER = "__base__"  # peft's name for "no adapter" in a mixed-adapter batch


def _cut_after_stop(text: str, stop: Sequence[str]) -> str:
    """The text up to and including its first stop string (as vLLM reports it), or all of it."""
    ends = [i + len(s) for s in stop if (i := text.find(s)) >= 0]
    return text[: min(ends)] if ends else text


def eos_ids(tokenizer: Any, model: torch.nn.Module) -> set[int]:
    """Every id that ends a response: the tokenizer's EOS and the generation config's."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None) if gen is not None else None
    ids.update([extra] if isinstance(extra, int) else (extra or []))
    return ids


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the token whose CDF interval holds `uniforms[row]` (in [0, 1)): a draw from `probs[row]`.

    Zero-probability tokens (masked by top-p) have empty intervals, so they are never picked.
    """
    cdf = probs.double().cumsum(-1)
    target = uniforms.to(cdf.device, torch.float64)[:, None] * cdf[:, -1:]
    picked = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    # A target that rounds up to the total mass would land past the end: take the last live token.
    last_live = probs.shape[-1] - 1 - (probs > 0).flip(-1).float().argmax(-1)
    return torch.minimum(picked, last_live)


def sample_next(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; return (token ids, their log-probs under the distribution sampled from).

    That distribution is softmax(logits / T) renormalised over its top-p nucleus, T the row's
    temperature, as vLLM's `processed_logprobs` (the module doc). A greedy row (temperature <= 0)
    ignores top-p and reports log softmax(logits), as `CallRecord.score_temperature` scores it.
    `uniforms[row]` in [0, 1) is the row's random draw for this step (ignored by greedy rows), so a
    row's token depends on its own logits and draw only.
    """
    logits = logits.float()
    greedy = logits.argmax(-1)
    sampling = temperature > 0
    scaled = logits / torch.where(sampling, temperature, 1.0)[:, None]
    nucleus = filter_top_p(scaled, torch.where(sampling, top_p, 1.0))
    logprobs = torch.log_softmax(nucleus, dim=-1)
    sampled = _inverse_cdf(nucleus.softmax(-1), uniforms)
    tokens = torch.where(temperature <= 0, greedy, sampled)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


def row_uniforms(seeds: Sequence[int] | None, steps: Sequence[int]) -> torch.Tensor:
    """The draws of every row for up to `max(steps)` decoding steps: [rows, max(steps)] on the CPU.

    Row i's first `steps[i]` draws come from its own generator seeded with `seeds[i]`, so they do not
    depend on the other rows; an unseeded call (`seeds` None) draws from torch's global generator.
    """
    width = max(steps, default=0)
    if seeds is None:
        return torch.rand((len(steps), width), dtype=torch.float64)
    out = torch.zeros((len(steps), width), dtype=torch.float64)
    for i, (seed, n) in enumerate(zip(seeds, steps)):
        if n > 0:
            out[i, :n] = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    return out


class TransformersBackend(ModuleSleep):
    """A `Backend` over a Hugging Face causal LM (optionally a peft model with several adapters).

    Args:
        model: the module to generate with; the trainer may share it with the learner.
        tokenizer: its tokenizer (decodes responses; gives EOS and pad ids).
        max_batch_size: the largest batch run at once (bounds activation and KV memory).
        share_prefill: prefill each distinct (prompt, adapter) of a batch once and copy its KV
            cache to the rows that repeat it (see the module doc).
        own_weights: `model` is the engine's own (not the learner's module), so sleeping frees its
            parameters (`engines.sleep`); False: its sleep calls are no-ops.

    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        share_prefill: bool = True,
        own_weights: bool = False,
    ):
        self.model = model
        self.own_weights = own_weights
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.share_prefill = share_prefill
        self.eos = eos_ids(tokenizer, model)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: Sequence[SamplingParams],
        *,
        adapters: Sequence[str | None] | None = None,
        seed: Seeds = None,
    ) -> list[Generation]:
        """Sample one response per prompt, `max_batch_size` prompts at a time.

        `seed`: None, a base seed (row i gets seed + i) or one seed per row (`base.row_seeds`); a
        row's tokens depend on its own seed, not on the chunk or batch it ran in.
        """
        if self.asleep:
            raise EngineAsleepError("the transformers engine is asleep: wake_weights, push the weights, wake_cache")
        if len(sampling) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(sampling)} sampling settings")
        adapters = list(adapters) if adapters is not None else [None] * len(prompts)
        seeds = row_seeds(seed, len(prompts))
        uniforms = row_uniforms(seeds, [s.max_new_tokens for s in sampling])
        out: list[Generation] = []
        for start in range(0, len(prompts), self.max_batch_size):
            part = slice(start, start + self.max_batch_size)
            out += self._generate_batch(prompts[part], sampling[part], adapters[part], uniforms[part])
        return out

    def _forward_kwargs(self, adapters: Sequence[str | None]) -> dict[str, Any]:
        if not hasattr(self.model, "peft_config"):
            if any(a is not None for a in adapters):
                raise ValueError("adapters were requested but the model has no LoRA adapters")
            return {}
        return {"adapter_names": [a if a is not None else BASE_ADAPTER for a in adapters]}

    def _prefill(self, prompts: Sequence[Sequence[int]], adapters: Sequence[str | None]) -> tuple:
        """Run the prompts once each where they repeat; return per-row (last logits, cache, mask, positions)."""
        dev, n = self.device, len(prompts)
        index: dict[tuple, int] = {}  # (prompt, adapter) -> its distinct index
        src = [index.setdefault((tuple(p), a), len(index)) for p, a in zip(prompts, adapters)]
        if not self.share_prefill:
            src = list(range(n))
        firsts: dict[int, int] = {}  # distinct index -> its first row
        for row, u in enumerate(src):
            firsts.setdefault(u, row)
        distinct = [prompts[firsts[u]] for u in range(len(firsts))]
        width = max(len(p) for p in distinct)
        ids = torch.full((len(distinct), width), self.pad_id, dtype=torch.long, device=dev)
        mask = torch.zeros((len(distinct), width), dtype=torch.long, device=dev)
        for i, p in enumerate(distinct):
            ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[i, width - len(p) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        kwargs = self._forward_kwargs([adapters[firsts[u]] for u in range(len(firsts))])
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1, **kwargs
        )
        logits, past = out.logits[:, -1, :], out.past_key_values
        if len(distinct) < n:  # fan the distinct prompts' KV out to their rows
            rows = torch.tensor(src, dtype=torch.long, device=dev)
            past.batch_select_indices(rows)
            logits, mask, positions = logits[rows], mask[rows], positions[rows]
        return logits, past, mask, positions[:, -1:] + 1

    @torch.no_grad()
    def _generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: Sequence[SamplingParams],
        adapters: Sequence[str | None],
        uniforms: torch.Tensor,
    ) -> list[Generation]:
        dev, n = self.device, len(prompts)
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt")
        temperature = torch.tensor([s.temperature for s in sampling], dtype=torch.float32, device=dev)
        top_p = torch.tensor([s.top_p for s in sampling], dtype=torch.float32, device=dev)
        limits = [s.max_new_tokens for s in sampling]
        kwargs = self._forward_kwargs(adapters)
        was_training = self.model.training
        self.model.eval()
        responses: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        done = [lim <= 0 for lim in limits]
        finish = ["length"] * n
        try:
            if not all(done):
                logits, past, mask, positions = self._prefill(prompts, adapters)
            uniforms = uniforms.to(dev)
            for step in range(max(limits, default=0)):
                tokens, token_logps = sample_next(logits, temperature, top_p, uniforms[:, step])
                tok_list, lp_list = tokens.tolist(), token_logps.tolist()
                for i in range(n):
                    if done[i]:
                        continue
                    responses[i].append(tok_list[i])
                    logps[i].append(lp_list[i])
                    if tok_list[i] in self.eos or self._hit_stop(responses[i], sampling[i].stop):
                        done[i], finish[i] = True, "stop"
                    elif len(responses[i]) >= limits[i]:
                        done[i] = True
                if all(done):
                    break
                # Finished rows keep decoding padding (masked out) so the batch stays rectangular.
                step_ids = torch.where(torch.tensor(done, device=dev), self.pad_id, tokens)[:, None]
                mask = torch.cat([mask, torch.ones((n, 1), dtype=mask.dtype, device=dev)], dim=1)
                out = self.model(
                    input_ids=step_ids,
                    attention_mask=mask,
                    position_ids=positions,
                    past_key_values=past,
                    use_cache=True,
                    **kwargs,
                )
                logits, past, positions = out.logits[:, -1, :], out.past_key_values, positions + 1
        finally:
            self.model.train(was_training)
        return [
            Generation(
                prompt_ids=list(p),
                response_ids=r,
                logprobs=lp,
                text=_cut_after_stop(self.tokenizer.decode(r, skip_special_tokens=True), s.stop),
                finish_reason=f,
            )
            for p, r, lp, f, s in zip(prompts, responses, logps, finish, sampling)
        ]

    def _hit_stop(self, response: list[int], stop: Sequence[str]) -> bool:
        """Whether the reply's text now contains a stop string (checked on its tail: earlier tokens were)."""
        if not stop:
            return False
        tail = self.tokenizer.decode(response[-(max(map(len, stop)) + 1) :], skip_special_tokens=True)
        return any(s in tail for s in stop)

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Copy tensors into the model by name; tensors that already are the model's own are skipped."""
        if self._parked is not None:
            raise EngineAsleepError("the transformers engine's weights are asleep: wake_weights before the push")
        params = dict(self.model.named_parameters())
        params.update(dict(self.model.named_buffers()))
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"load_weights: the model has no parameter {name!r}")
            target = params[name]
            if target.data_ptr() != tensor.data_ptr():
                target.copy_(tensor.to(target.device, target.dtype))
