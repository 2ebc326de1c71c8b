"""One step's metrics row: rewards and accuracy, per-agent figures, per-model learner figures.

Keys:
- `accuracy` (share of episodes the env counts correct: the final infos' `correct`), `reward/team`
  (mean team reward per episode), `reward/mean` (mean per-call reward as the env gave it, penalties
  included: what the estimator sees);
- per agent: `reward/<agent>`, `valid/<agent>` (well-formed share), `calls/<agent>` (calls per
  episode), `response_tokens/<agent>` (mean response length), `truncated/<agent>` (share of calls
  that hit max_new_tokens);
- where the env reports verdicts on graded attempts (math-2agent): `approve_right` / `approve_wrong`,
  how often the Verifier approved a right / wrong attempt this step; with `algo.balance_strata`,
  `balance/<agent>/<stratum>`, the weight the step gave that stratum's advantages;
- where the env counts its grades (math: the `grades` fact): `grade/checks` (answers checked against a
  reference), `grade/errors` (checks the grader failed: a reference it cannot parse, an exception, a worker
  that died twice) and `grade/over_budget` (checks past a time or size bound: the answer's fault);
- per model: `grad_norm/<model>` (pre-clip: the stability metric) and `learner/<model>/<key>` for
  the rest of the learner's figures (loss, clip_frac, entropy, skipped, ...);
- `tokens/generated`, `tokens/per_s` (generation throughput), `mem/peak_rss_mb`; the trainer adds
  `time/step`, `time/step_cpu` (CPU seconds), `time/rollout`, `time/update`, `data/cursor`, `adv/...` and the
  parts of a step that are neither generate nor update: `time/prompts` (chat template + tokeniser),
  `time/advantages`, `time/sync` (weight push to the engine, inside `time/update`), `time/metrics`,
  and per agent `groups/<agent>/{singleton_share,zero_var_share,size_min,size_median,size_max}`: the
  share of its calls whose baseline key gave them no signal, and the key sizes (`group_stats`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from drmas_envs import EpisodeResult
from drmas_train.learner.memory import peak_rss_mb
from drmas_train.rollout import RolloutBatch


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else 0.0


def step_metrics(
    step: int, batch: RolloutBatch, updates: dict[str, dict[str, float]], agents: Sequence[str]
) -> dict[str, Any]:
    """The metrics row of one step (see the module docstring for the keys)."""
    recs = batch.records
    team = [float(ep.info.get("team_reward", 0.0)) for ep in batch.episodes]
    row: dict[str, Any] = {
        "step": step,
        "episodes": len(batch.episodes),
        "calls": len(recs),
        "accuracy": _mean([bool(ep.info["correct"]) for ep in batch.episodes]),
        "reward/team": _mean(team),
        "reward/mean": _mean([r.reward for r in recs]),
    }
    n_eps = max(len(batch.episodes), 1)
    for agent in agents:
        mine = [r for r in recs if r.agent == agent]
        row[f"reward/{agent}"] = _mean([r.reward for r in mine])
        row[f"valid/{agent}"] = _mean([r.valid for r in mine])
        row[f"calls/{agent}"] = len(mine) / n_eps
        row[f"response_tokens/{agent}"] = _mean([len(r.response_ids) for r in mine])
        row[f"truncated/{agent}"] = _mean([r.extra.get("finish") == "length" for r in mine])
    for model, metrics in updates.items():
        row[f"grad_norm/{model}"] = float(metrics.get("grad_norm", 0.0))
        for key, value in metrics.items():
            if key != "grad_norm":
                row[f"learner/{model}/{key}"] = float(value)
    generated = sum(len(r.response_ids) for r in recs)
    row["tokens/generated"] = generated
    row["tokens/per_s"] = generated / batch.gen_seconds if batch.gen_seconds > 0 else 0.0
    row["time/generate"] = batch.gen_seconds
    row["mem/peak_rss_mb"] = peak_rss_mb()
    row.update(verdict_metrics(batch.episodes))
    row.update(grade_metrics(batch.episodes))
    return row


def grade_metrics(results: Sequence[EpisodeResult]) -> dict[str, int]:
    """`grade/checks`, `grade/errors`, `grade/over_budget` summed over episodes whose env counts its grades
    (the final infos' `grades`: outcome -> count); {} when none does.
    """
    counts = [res.info["grades"] for res in results if isinstance(res.info.get("grades"), dict)]
    if not counts:
        return {}
    return {
        "grade/checks": sum(int(sum(c.values())) for c in counts),
        "grade/errors": sum(int(c.get("error", 0)) for c in counts),
        "grade/over_budget": sum(int(c.get("over_budget", 0)) for c in counts),
    }


def verdict_metrics(results: Sequence[EpisodeResult], prefix: str = "") -> dict[str, float]:
    """Approval rates of reviewed attempts that are right / wrong (envs reporting verdicts and graded attempts)."""
    approve: dict[bool, list[bool]] = {True: [], False: []}
    for res in results:
        verdicts, attempts = res.info.get("verdicts"), res.info.get("attempts_correct")
        if verdicts is None or attempts is None:
            continue
        for verdict, attempt_right in zip(verdicts, attempts):  # review i follows attempt i
            if verdict is not None:  # None: the attempt was not reviewed
                approve[bool(attempt_right)].append(verdict == "approve")
    out = {}
    if approve[True]:
        out[f"{prefix}approve_right"] = float(np.mean(approve[True]))
    if approve[False]:
        out[f"{prefix}approve_wrong"] = float(np.mean(approve[False]))
    return out
