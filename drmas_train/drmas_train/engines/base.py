"""The policy-engine seam: generate a batch of token-id prompts; take new weights.

The rollout talks to every engine (transformers, vLLM, an OpenAI-compatible server) through this
interface only, so a backend slots in without touching rollout or learner.

Conventions every backend keeps:
- Prompts are token ids (the rollout applies the model's chat template once); responses come
  back as the exact sampled ids, so training sees the ids that were sampled (no decode/re-encode).
- `logprobs[i]` is the log-probability of `response_ids[i]` under the distribution it was sampled
  from: softmax(logits / T), T the call's sampling temperature, renormalised over its top-p nucleus
  (vLLM's `processed_logprobs`; the transformers backend matches it); a greedy call ignores top-p and
  reports log softmax(logits) (T = 1). The learner recomputes log softmax(logits / T) without top-p
  (`CallRecord.score_temperature`), as the reference (verl) does: at top-p 1 the ratio against these
  log-probs is 1 on-policy; at top-p < 1 it is the nucleus mass, the same on every backend, which
  `old_logprobs` "sampled" and "decoupled" see and "recompute" does not.
- `temperature == 0` means greedy decoding.
- Seeds (`seed=`): None samples unseeded. One int `s` seeds row i with `s + i` (the same batch in
  the same order reproduces). A sequence gives every row its own seed: row i's tokens then depend on
  its prompt, settings, adapter and `seed[i]` only, not on the batch or position it ran in, so a
  batch split across data-parallel ranks samples what one engine would (the rollout passes one seed
  per call, derived from the call's identity: `rollout.call_seed`). Greedy rows ignore their seed.
- The end-of-sequence token, when sampled, is kept as the last response id.

Sleep (`Sleeper`, `models.engine.sleep`): every backend can release its memory between generations
and take it back. The order is `sleep()`, then before the next generation `wake_weights()`, a push of
the current weights (`load_weights`), `wake_cache()`, `generate`, `sleep()` again
(`engines.sleep.SleepingEngine` keeps it). `generate` on a sleeping engine raises `EngineAsleepError`.
An engine that cannot free anything says why in `resident_because` and treats the calls as no-ops.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

Seeds = int | Sequence[int] | None
"""A call's seeds: none, one base seed (row i gets base + i), or one seed per row (see the module doc)."""


def row_seeds(seed: Seeds, n: int) -> list[int] | None:
    """One seed per row of an n-row call, or None for an unseeded call.

    Raises:
        ValueError: a per-row sequence whose length is not n.

    """
    if seed is None:
        return None
    if isinstance(seed, numbers.Integral):
        return [int(seed) + i for i in range(n)]
    seeds = [int(s) for s in seed]
    if len(seeds) != n:
        raise ValueError(f"got {len(seeds)} seeds for {n} prompts")
    return seeds


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one call; per agent in the config."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = ()
    """Strings that end the reply as soon as its text contains one; the reply keeps it (the token
    that completed it is the last response id) and finishes with reason "stop"."""


@dataclass
class Generation:
    """One sampled response."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str = "stop"  # "stop" (EOS) or "length" (max_new_tokens reached)
    version: int | None = None
    """The weight version that sampled it, stamped by whoever versions the engine (`rollout.versions`,
    a placed worker); None where nobody does."""


@runtime_checkable
class Backend(Protocol):
    """A policy engine for one model (and its per-agent LoRA adapters, if any)."""

    tokenizer: Any

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: Sequence[SamplingParams],
        *,
        adapters: Sequence[str | None] | None = None,
        seed: Seeds = None,
    ) -> list[Generation]:
        """Sample one response per prompt; `sampling[i]`, `adapters[i]` and the row's seed apply to prompt i."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Make the engine generate with these weights from now on (no restart)."""
        ...


class EngineAsleepError(RuntimeError):
    """A sleeping engine was asked to generate (or take weights before its weights were woken)."""


@runtime_checkable
class Sleeper(Protocol):
    """An engine that releases its memory between generations (the module doc gives the order of calls)."""

    resident_because: str | None
    """Why the engine cannot free memory by sleeping (its sleep calls are then no-ops); None: it can."""

    @property
    def asleep(self) -> bool:
        """Whether any of the engine's memory is released (weights or cache)."""
        ...

    def sleep(self) -> None:
        """Release the weights and the KV cache; their contents are lost (the next wake is given the weights)."""
        ...

    def wake_weights(self) -> None:
        """Take the weights' memory back (its contents undefined until the next `load_weights`)."""
        ...

    def wake_cache(self) -> None:
        """Take the KV cache's memory back; after it the engine generates."""
        ...
