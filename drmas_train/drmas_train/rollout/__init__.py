"""Rollout: the episodes of one step (`episodes`), and the weight versions and producer of asynchronous runs.

- `episodes`: B tasks x n episodes in lock-step, every call recorded (`rollout`, `RolloutBatch`).
- `versions`: the weight version each call sampled with (`WeightClock`, `VersionedBackend`) and the
  staleness of a batch (`staleness_stats`, `drop_stale_groups`).
- `pipeline`: bounded-staleness asynchronous training's producer (`RolloutProducer`, docs/training.md).
"""

from drmas_train.rollout.episodes import (
    RolloutBatch,
    assign_rewards,
    call_seed,
    chat_prompt,
    reset_envs,
    rollout,
    truncate,
)

__all__ = ["RolloutBatch", "assign_rewards", "call_seed", "chat_prompt", "reset_envs", "rollout", "truncate"]
