"""Validation during training: the team on held-out problems, with the current weights.

Protocol (`EvalConfig`; defaults: the paper's sampled evaluation, scaled down for a CPU):

- Problems: the first `n_problems` of the held-out split (`split`, "test" for the generated set) in
  the order fixed by `seed`: the same problems at every validation, none of them a training problem.
- Sampled pass: `k` episodes per problem at `temperature` / `top_p` (paper: 16 at 0.6 / 0.95) ->
  `val/avg@k`, `val/pass@k` (an episode counts when the env grades the team right), `val/<source>/avg@k`,
  `val/valid/<agent>` (well-formed share of the agent's calls), and, where the env reports verdicts
  against graded attempts (math-2agent), `val/approve_right` / `val/approve_wrong`: how often the
  Verifier approves an attempt that is right / wrong.
- Greedy pass (`greedy`): one episode per problem at temperature 0 -> `val/avg@1`, and, where the env
  reports it (math), `val/answer_acc`: the last number of the Solver's last attempt, boxed or not, is
  right. avg@1 counts only well-formed right answers; answer_acc tells how much of a change is skill
  rather than format.
- Every pass goes through the training rollout (the same engines, chat template and per-agent
  response caps) with a fixed sampling seed, so two validations differ only by the weights.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

import drmas_envs
from drmas_envs import EpisodeResult
from drmas_train.backends.base import SamplingParams
from drmas_train.config import EvalConfig
from drmas_train.metrics import verdict_metrics
from drmas_train.models.assignment import Policy
from drmas_train.records import CallRecord
from drmas_train.rollout import rollout


def held_out_kwargs(env_kwargs: Mapping[str, Any], cfg: EvalConfig) -> dict[str, Any]:
    """The env options of the held-out set: the training env's, the split, then `cfg.env_kwargs`."""
    out = dict(env_kwargs)
    if cfg.split is not None:
        out["split"] = cfg.split
    out.update(cfg.env_kwargs)
    return out


def _correct(result: EpisodeResult) -> bool:
    """The env's own outcome (`WorkflowEnv` reports it in every agent's final info)."""
    return bool(result.info["correct"])


def _run(
    envs: Sequence[Any],
    problems: Sequence[int],
    k: int,
    serving: Mapping[str, Policy],
    sampling: Mapping[str, SamplingParams],
    *,
    seed: int,
    max_prompt_tokens: int,
    batch_episodes: int,
    template_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    truncation: str = "middle",
) -> tuple[list[EpisodeResult], list[list[CallRecord]], list[int]]:
    """Run `k` episodes of each problem, `batch_episodes` at a time: results, calls and problem per episode."""
    per_batch = max(1, min(batch_episodes, len(envs)) // k)
    results: list[EpisodeResult] = []
    calls: list[list[CallRecord]] = []
    owners: list[int] = []
    for b, start in enumerate(range(0, len(problems), per_batch)):
        chunk = list(problems[start : start + per_batch])
        batch = rollout(
            envs[: len(chunk) * k],
            chunk,
            k,
            serving,
            sampling,
            seed=seed + b,
            max_prompt_tokens=max_prompt_tokens,
            template_kwargs=template_kwargs,
            truncation=truncation,
        )
        by_episode: dict[int, list[CallRecord]] = defaultdict(list)
        for r in batch.records:
            by_episode[r.episode_id].append(r)
        results.extend(batch.episodes)
        calls.extend(by_episode[e] for e in range(len(batch.episodes)))
        owners.extend(batch.task_of)
    return results, calls, owners


def _sampled_metrics(
    results: Sequence[EpisodeResult], calls: Sequence[Sequence[CallRecord]], owners: Sequence[int], k: int, agents
) -> dict[str, float]:
    right: dict[int, list[bool]] = defaultdict(list)
    source: dict[int, str] = {}
    for res, p in zip(results, owners):
        right[p].append(_correct(res))
        source[p] = str(res.info.get("source", "default"))
    row = {
        f"val/avg@{k}": float(np.mean([np.mean(v) for v in right.values()])),
        f"val/pass@{k}": float(np.mean([any(v) for v in right.values()])),
    }
    for src in sorted(set(source.values())):
        mine = [np.mean(right[p]) for p in right if source[p] == src]
        row[f"val/{src}/avg@{k}"] = float(np.mean(mine))
    flat = [c for episode in calls for c in episode]
    for agent in agents:
        mine = [c for c in flat if c.agent == agent]
        if mine:
            row[f"val/valid/{agent}"] = float(np.mean([c.valid for c in mine]))
            row[f"val/response_tokens/{agent}"] = float(np.mean([len(c.response_ids) for c in mine]))
    row.update(verdict_metrics(results, prefix="val/"))
    return row


def validate(
    envs: Sequence[Any],
    serving: Mapping[str, Policy],
    sampling: Mapping[str, SamplingParams],
    cfg: EvalConfig,
    *,
    max_prompt_tokens: int,
    template_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    truncation: str = "middle",
) -> dict[str, float]:
    """Run the validation protocol (module docstring) and return its `val/*` metrics.

    Args:
        envs: at least `min(batch_episodes, n_problems * k)` envs of the held-out set (reset here).
        serving: agent -> the policy that serves it (the training engines, current weights).
        sampling: agent -> its training sampling settings (only the response caps are kept).
        cfg: the protocol.
        max_prompt_tokens: as in training.
        template_kwargs: agent -> chat-template variables, as in training (e.g. enable_thinking=False).
        truncation: which part of an over-long prompt is cut, as in training.

    """
    probe = envs[0].unwrapped
    order = probe.task_order(cfg.seed)
    problems = order[: min(cfg.n_problems, len(order))]
    agents = list(envs[0].possible_agents)
    run = dict(
        max_prompt_tokens=max_prompt_tokens,
        batch_episodes=cfg.batch_episodes,
        template_kwargs=template_kwargs,
        truncation=truncation,
    )
    sampled = {a: replace(s, temperature=cfg.temperature, top_p=cfg.top_p) for a, s in sampling.items()}
    results, calls, owners = _run(envs, problems, cfg.k, serving, sampled, seed=cfg.seed * 7919 + 1, **run)
    row = _sampled_metrics(results, calls, owners, cfg.k, agents)
    if cfg.greedy:
        greedy = {a: replace(s, temperature=0.0, top_p=1.0) for a, s in sampling.items()}
        results, _, _ = _run(envs, problems, 1, serving, greedy, seed=cfg.seed * 7919 + 2, **run)
        row["val/avg@1"] = float(np.mean([_correct(r) for r in results]))
        loose = [r.info["loose_correct"] for r in results if "loose_correct" in r.info]
        if loose:
            row["val/answer_acc"] = float(np.mean(loose))
    row["val/n_problems"] = float(len(problems))
    return row


def make_eval_envs(env_id: str, env_kwargs: Mapping[str, Any], cfg: EvalConfig) -> list[Any]:
    """The held-out envs validation steps in lock-step (as many as one batch needs)."""
    kwargs = held_out_kwargs(env_kwargs, cfg)
    n = min(cfg.batch_episodes, cfg.n_problems * cfg.k)
    n = max(cfg.k, n - n % cfg.k)
    return [drmas_envs.make(env_id, **kwargs) for _ in range(n)]
