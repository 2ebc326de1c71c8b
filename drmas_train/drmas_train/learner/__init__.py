"""The update stage: one `Learner` per model turns scored calls into a PPO step on its weights.

Modules: `ppo` (the `Learner`: the PPO step top to bottom), `loss` (the clipped token losses and the
batch tensors), `forward` (how a micro-batch is scored: padded rows, or packed as a prefix tree by
`prefix_tree`), `adapters` (LoRA adapters: micro-batches and param groups), `metrics` (what an update
reports), `parallel` and `distributed` (alone, replicated or FSDP-sharded data-parallel ranks).
The learner's knobs are `drmas_train.config.PPOConfig` (the `learner` section).
"""

from drmas_train.config import PPOConfig
from drmas_train.learner.adapters import lora_param_groups
from drmas_train.learner.ppo import Learner

__all__ = ["Learner", "PPOConfig", "lora_param_groups"]
