"""Diagnostics of the baseline keys: how many of each agent's calls a step could actually learn from.

A group-relative estimator compares the samples that share a key (`advantages`: under ``drmas``
the calls of one (prompt group, agent); under ``pooled`` the calls of one prompt group; under
``grpo`` / ``rloo`` the episodes of one prompt group, each call inheriting its episode's key). Two
silent failures leave an agent training on nothing, with every loss and grad norm still finite:

- singleton keys: a key holding one sample has no baseline. Trainers that fall back to the raw
  reward turn GRPO into REINFORCE there; ours gives the call advantage 0 (no update at all). Typical
  cause: an agent called once per episode with ``rollout.group_size`` 1, or an agent that only some
  episodes of a group reach.
- zero-variance keys: every sample of the key got the same reward, so every advantage is 0. Typical
  causes: all episodes of a prompt ended alike (tasks too hard or too easy for the current policy),
  and the agent's calls were all equally well or ill formed (a format it cannot reach yet earns every
  call the same penalty).

`group_stats` measures both per agent (shares of its calls, disjoint: a singleton is not counted as
zero-variance; their sum is the share of calls whose advantage is 0 by rule) and the sizes of the
keys its calls sit in. `GroupWarnings` turns a share at or over ``algo.group_warn_share`` into one log
warning per (agent, kind) per run that names the likely cause.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from drmas_train.algorithm.advantages import ESTIMATORS, as_column
from drmas_train.config import Estimator

__all__ = ["GroupWarnings", "group_stats"]


def _key_table(keys: Sequence[Hashable], values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Number the distinct keys: (the key of each sample, each key's size, whether its values are all equal)."""
    members: dict[Hashable, list[int]] = {}
    for i, k in enumerate(keys):
        members.setdefault(k, []).append(i)
    key_of_sample = np.empty(len(keys), dtype=np.int64)
    sizes, flat = np.empty(len(members), dtype=np.int64), np.empty(len(members), dtype=bool)
    for j, rows in enumerate(members.values()):
        key_of_sample[rows] = j
        sizes[j] = len(rows)
        # Exact equality, as `advantages.normalize_groups` decides that a key gives advantage 0.
        flat[j] = len(rows) > 1 and bool(np.all(values[rows] == values[rows[0]]))
    return key_of_sample, sizes, flat


def group_stats(
    rewards: Any,
    *,
    group_ids: Any,
    agent_ids: Any,
    episode_ids: Any,
    estimator: Estimator = "drmas",
) -> dict[str, float]:
    """Per-agent shares of calls without a learning signal, and the sizes of their baseline keys.

    Args:
        rewards: per-call rewards (what the estimator sees).
        group_ids: per-call prompt-group ids.
        agent_ids: per-call logical agent ids.
        episode_ids: per-call episode ids.
        estimator: the estimator in use; it decides what a key holds (module docstring).

    Returns:
        ``groups/<agent>/singleton_share`` (share of the agent's calls in a key of one sample),
        ``groups/<agent>/zero_var_share`` (share in keys of two or more samples, all with the same
        reward), and ``groups/<agent>/size_min``, ``size_median``, ``size_max`` (samples per key, over
        the distinct keys holding the agent's calls). Agents in first-seen order; {} for no calls.

    Raises:
        ValueError: unknown estimator or columns of different lengths.

    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown estimator {estimator!r}; choose one of {ESTIMATORS}")
    r = as_column(rewards, "rewards").astype(np.float64)
    g, a, e = (
        as_column(x, n) for x, n in ((group_ids, "group_ids"), (agent_ids, "agent_ids"), (episode_ids, "episode_ids"))
    )
    if not len(r) == len(g) == len(a) == len(e):
        raise ValueError(
            f"lengths differ: rewards {len(r)}, group_ids {len(g)}, agent_ids {len(a)}, episode_ids {len(e)}"
        )
    keys, values, sample_of_call = ESTIMATORS[estimator].samples(r, g, a, e)
    key_of_sample, sizes, flat = _key_table(keys, values)
    key_of_call = key_of_sample[sample_of_call]
    out: dict[str, float] = {}
    for agent in dict.fromkeys(a.tolist()):
        mine = key_of_call[a == agent]
        held = np.unique(mine)
        out[f"groups/{agent}/singleton_share"] = float(np.mean(sizes[mine] == 1))
        out[f"groups/{agent}/zero_var_share"] = float(np.mean(flat[mine]))
        out[f"groups/{agent}/size_min"] = float(sizes[held].min())
        out[f"groups/{agent}/size_median"] = float(np.median(sizes[held]))
        out[f"groups/{agent}/size_max"] = float(sizes[held].max())
    return out


class GroupWarnings:
    """Warns once per run per (agent, kind) when a share of `group_stats` reaches a threshold.

    The memory of what was said lives in this object, so a resumed run may say it once more.

    Args:
        threshold: the share (0-1] at which to warn; None never warns.
        estimator: the estimator in use (named in the message).
        group_size: ``rollout.group_size`` (a singleton under group size 1 has an obvious cause).

    """

    KINDS = ("singleton_share", "zero_var_share")

    def __init__(self, threshold: float | None, *, estimator: Estimator, group_size: int):
        if threshold is not None and not 0.0 < threshold <= 1.0:
            raise ValueError(f"algo.group_warn_share must be in (0, 1] or None, got {threshold!r}")
        self.threshold = threshold
        self.estimator = estimator
        self.group_size = group_size
        self.warned: set[tuple[str, str]] = set()

    def check(self, row: dict[str, Any], agents: Sequence[str]) -> list[str]:
        """The new warnings for one step's metrics row (each (agent, kind) at most once per run)."""
        if self.threshold is None:
            return []
        out = []
        for agent in agents:
            for kind in self.KINDS:
                share = row.get(f"groups/{agent}/{kind}")
                if share is None or share < self.threshold or (agent, kind) in self.warned:
                    continue
                self.warned.add((agent, kind))
                cause = self._singleton_cause(agent, row) if kind == "singleton_share" else self._flat_cause(agent, row)
                out.append(
                    f"step {row.get('step')}: {share:.0%} of {agent}'s calls are in baseline keys "
                    f"({ESTIMATORS[self.estimator].key}) "
                    + ("of one sample" if kind == "singleton_share" else "whose rewards are all equal")
                    + f", so their advantage is 0 and they teach {agent} nothing. Likely cause: {cause} "
                    f"(groups/{agent}/{kind} in metrics.jsonl; algo.group_warn_share sets this threshold)"
                )
        return out

    def _singleton_cause(self, agent: str, row: dict[str, Any]) -> str:
        if self.group_size == 1:
            return (
                "rollout.group_size is 1, so each prompt has one episode and nothing to compare with "
                "(trainers that fall back to the raw reward turn GRPO into REINFORCE here); raise it"
            )
        calls = row.get(f"calls/{agent}")
        reach = f" (calls/{agent} {calls:.2f} per episode)" if calls is not None else ""
        return (
            f"{agent} is reached in only one episode of most groups{reach}, "
            "or the prompt-group ids are not shared by a prompt's episodes"
        )

    def _flat_cause(self, agent: str, row: dict[str, Any]) -> str:
        valid = row.get(f"valid/{agent}")
        if valid is not None and valid <= 0.05:
            return (
                f"{agent}'s format looks unreachable (valid/{agent} {valid:.2f}): every call earns the same "
                "penalty and the episodes of a prompt end alike; make the format reachable (a `reply_prefix` "
                "that opens the reply with its tag, stop strings at the closing tag, a format-following model)"
            )
        acc = row.get("accuracy")
        outcome = f" (accuracy {acc:.2f})" if acc is not None else ""
        return (
            f"the episodes of a prompt all ended alike{outcome}: the tasks are too hard or too easy for the "
            "current policy, and its calls were all equally well or ill formed; easier / harder tasks or a "
            "larger rollout.group_size give it contrast"
        )
