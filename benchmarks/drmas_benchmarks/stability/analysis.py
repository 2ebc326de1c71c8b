"""Stability analysis: gradient-norm summaries and the per-agent advantage second moment.

Pure functions behind `benchmarks/drmas_benchmarks/stability`, usable on any run directory:

- `grad_norm_summary`: median, max, max/median, spikes and skipped steps of one model's pre-clip
  gradient norms. A spike is a step whose norm exceeds `factor` (5) times the running median of
  the previous `window` (20) finite norms; the first `min_history` (3) steps cannot be spikes.
  Non-finite norms are skipped steps; a norm of exactly 0 is a step without learning signal (every
  advantage 0, e.g. all-constant groups). Neither takes part in the statistics; both are counted.
- `second_moments`: E[A^2 | agent] under every estimator, and the prediction for one global
  (pooled) baseline per prompt group g: with unbiased group variance s_g^2 and agent k's
  population moments mu_kg, sigma_kg^2 inside g,

      E[A^2 | k, g] = (sigma_kg^2 + (mu_kg - mu_g)^2) / s_g^2,

  averaged over groups with weights n_kg (constant groups give 0). The gap term
  (mu_kg - mu_g)^2 / s_g^2 is the paper's argument: an agent whose mean reward sits away from the
  group's gets a large second moment, hence large gradients, under global normalisation; with
  per-agent statistics (drmas) E[A^2 | k, g] = (n_kg - 1) / n_kg <= 1 for every agent.
- `synthetic_calls`: per-call rewards of a team whose agents differ in call counts and format
  error rates, to run the analysis without a trainer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from drmas_train.algorithm.advantages import ESTIMATORS, agent_moments, compute_advantages, predicted_pooled_sq_mean

__all__ = [
    "grad_norm_summary",
    "predicted_pooled_sq_mean",
    "running_median_spikes",
    "second_moments",
    "synthetic_calls",
]


def running_median_spikes(
    norms: Sequence[float], *, factor: float = 5.0, window: int = 20, min_history: int = 3
) -> list[int]:
    """Indices of norms above `factor` x the median of the previous `window` finite, non-zero norms."""
    history: list[float] = []
    spikes = []
    for i, n in enumerate(norms):
        if not math.isfinite(n) or n == 0:
            continue
        if len(history) >= min_history and n > factor * float(np.median(history[-window:])):
            spikes.append(i)
        history.append(n)
    return spikes


def grad_norm_summary(norms: Sequence[float], *, factor: float = 5.0, window: int = 20) -> dict[str, float]:
    """Median, 90th percentile, max, max/median, spikes, skipped and zero-signal step counts of grad norms.

    The 90th percentile (linear interpolation) shows a heavy tail that one max or a spike count misses.
    """
    arr = np.asarray([float(n) for n in norms], dtype=np.float64)
    finite = arr[np.isfinite(arr) & (arr != 0)]
    med = float(np.median(finite)) if finite.size else float("nan")
    mx = float(finite.max()) if finite.size else float("nan")
    return {
        "steps": float(arr.size),
        "median": med,
        "p90": float(np.percentile(finite, 90)) if finite.size else float("nan"),
        "max": mx,
        "max_over_median": mx / med if finite.size and med > 0 else float("nan"),
        "spikes": float(len(running_median_spikes(arr.tolist(), factor=factor, window=window))),
        "skipped": float((~np.isfinite(arr)).sum()),
        "zero": float((arr == 0).sum()),
    }


def second_moments(
    rewards: Any, *, group_ids: Any, agent_ids: Any, episode_ids: Any, norm_by_std: bool = True
) -> dict[str, dict[str, float]]:
    """Per agent: calls, mean reward, E[A^2] under each estimator, and the pooled prediction.

    Returns:
        {agent: {"n", "reward_mean", "sq_<estimator>" for each estimator, "predicted_pooled",
        "gap"}}.

    """
    ids = {"group_ids": group_ids, "agent_ids": agent_ids, "episode_ids": episode_ids}
    out: dict[str, dict[str, float]] = {}
    for agent, m in agent_moments(rewards, agent_ids).items():
        out[agent] = {"n": m["n"], "reward_mean": m["mean"]}
    for est in ESTIMATORS:
        adv = compute_advantages(np.asarray(rewards, dtype=np.float64), **ids, estimator=est, norm_by_std=norm_by_std)
        for agent, m in agent_moments(adv, agent_ids).items():
            out[agent][f"sq_{est}"] = m["sq_mean"]
    if norm_by_std:
        for agent, p in predicted_pooled_sq_mean(rewards, group_ids=group_ids, agent_ids=agent_ids).items():
            out[agent].update(predicted_pooled=p["predicted"], gap=p["gap"])
    return out


def synthetic_calls(
    agents: Mapping[str, tuple[int, float]],
    *,
    n_groups: int = 64,
    group_size: int = 8,
    penalty: float = 0.1,
    difficulty: tuple[float, float] = (0.5, 0.5),
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Per-call rewards of a team on synthetic tasks, reward = team reward - penalty if malformed.

    Args:
        agents: agent -> (calls per episode, probability that a call is malformed).
        n_groups: prompt groups.
        group_size: episodes per group.
        penalty: the format penalty per malformed call.
        difficulty: Beta(a, b) of each prompt's success probability; (0.5, 0.5) gives many
            all-right and all-wrong groups, as a small model on a benchmark does.
        seed: the random seed.

    Returns:
        {"rewards", "group_ids", "agent_ids", "episode_ids"}, one entry per call.

    """
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {"rewards": [], "group_ids": [], "agent_ids": [], "episode_ids": []}
    for gid in range(n_groups):
        p = rng.beta(*difficulty)
        for j in range(group_size):
            team = float(rng.random() < p)
            for agent, (calls, p_bad) in agents.items():
                for _ in range(calls):
                    cols["rewards"].append(team - penalty * float(rng.random() < p_bad))
                    cols["group_ids"].append(gid)
                    cols["agent_ids"].append(agent)
                    cols["episode_ids"].append(gid * group_size + j)
    return {k: np.asarray(v) for k, v in cols.items()}


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file; a malformed line raises with the file and line number."""
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{i}: not JSON ({err.msg})") from None
    return rows


def as_float(value: Any) -> float:
    """A metric value as float; the run log writes non-finite floats as strings ("nan", "inf")."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def calls_from_trajectories(rows: Iterable[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Per-call arrays from trajectories.jsonl rows; groups and episodes are keyed per step."""
    cols: dict[str, list] = {"rewards": [], "group_ids": [], "agent_ids": [], "episode_ids": []}
    for row in rows:
        for call in row["calls"]:
            cols["rewards"].append(float(call["reward"]))
            cols["group_ids"].append(f"{row['step']}/{row['group']}")
            cols["agent_ids"].append(str(call["agent"]))
            cols["episode_ids"].append(f"{row['step']}/{row['episode']}")
    return {k: np.asarray(v) for k, v in cols.items()}
