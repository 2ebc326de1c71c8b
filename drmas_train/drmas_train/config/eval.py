"""`EvalConfig`: validation on held-out problems during training (`drmas_train.run.validation` runs it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EvalConfig:
    """Validation during training (`drmas_train.run.validation`); `every: 0` and `before_train: false` turn it off."""

    every: int = 10
    """Validate after every N training steps and after the last one; 0: never during training (verl: test_freq)."""
    before_train: bool = True
    """Validate the initial weights before step 1 (verl: val_before_train), the baseline every gain is read from."""
    k: int = 4
    """Sampled episodes per problem: avg@k and pass@k (paper: 16)."""
    n_problems: int = 128
    """Held-out problems, the first of the split in a fixed order; the same at every validation."""
    temperature: float = 0.6
    """Sampling temperature of the sampled pass (paper: 0.6)."""
    top_p: float = 0.95
    """Nucleus mass of the sampled pass (paper: 0.95)."""
    greedy: bool = True
    """Also run one greedy episode per problem: val/avg@1 and val/answer_acc (the mode, not the sampler)."""
    split: str | None = "test"
    """The held-out split passed to the env (`split=`); None: the env's own kwargs unchanged (make sure
    `env_kwargs` then names held-out data)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra env options for validation only, on top of the training env's (e.g. dataset: math500)."""
    seed: int = 0
    """Fixes the problem order and the sampling noise, so validations differ only by the weights."""
    batch_episodes: int = 256
    """Episodes run in lock-step at once (bounds the generation batch and memory)."""

    def __post_init__(self) -> None:
        if self.every < 0 or self.k < 1 or self.n_problems < 1 or self.batch_episodes < 1:
            raise ValueError("eval.every must be >= 0; eval.k, eval.n_problems and eval.batch_episodes >= 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("eval.temperature must be >= 0 and eval.top_p in (0, 1]")

    @property
    def enabled(self) -> bool:
        """Whether any validation runs."""
        return self.every > 0 or self.before_train

    def due(self, step: int, last_step: int) -> bool:
        """Whether to validate after training step `step` (1-based) of a run of `last_step` steps."""
        return self.every > 0 and (step % self.every == 0 or step == last_step)
