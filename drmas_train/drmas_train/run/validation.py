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
- Metrics: `drmas_envs.evaluate.summarise`, as every evaluation in the project (`drmas-train eval`,
  `drmas-envs eval`); `evaluate_team` returns them in its shape, `metrics_row` as the `val/*` row.
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
from drmas_envs.evaluate import summarise, tally
from drmas_train.algorithm.records import CallRecord
from drmas_train.config import EvalConfig, TrainConfig, Truncation
from drmas_train.engines.assignment import Policy
from drmas_train.engines.base import SamplingParams
from drmas_train.rollout import rollout
from drmas_train.run.metrics import grade_metrics, verdict_metrics


def held_out_kwargs(env_kwargs: Mapping[str, Any], cfg: EvalConfig) -> dict[str, Any]:
    """The env options of the held-out set: the training env's, the split, then `cfg.env_kwargs`."""
    out = dict(env_kwargs)
    if cfg.split is not None:
        out["split"] = cfg.split
    out.update(cfg.env_kwargs)
    return out


def team_env_kwargs(cfg: TrainConfig, probe: Any) -> dict[str, Any]:
    """The run's env kwargs: `env.kwargs`, with format penalties from `env.format_penalty` and per-agent overrides.

    Args:
        cfg: the run's configuration.
        probe: an env made with `env.kwargs` (its own default penalties are the base).

    """
    kwargs = dict(cfg.env.kwargs)
    own = {a: o.format_penalty for a, o in cfg.agents.items() if o.format_penalty is not None}
    if cfg.env.format_penalty is not None or own:
        base = dict(probe.unwrapped.format_penalty)
        if cfg.env.format_penalty is not None:
            base = {a: cfg.env.format_penalty for a in probe.possible_agents}
        kwargs["format_penalty"] = {**base, **own}
    return kwargs


def agent_sampling(cfg: TrainConfig, agent: str) -> SamplingParams:
    """The sampling settings of `agent`'s calls: the rollout's, then the agent's own overrides."""
    r, o = cfg.rollout, cfg.agent(agent)
    return SamplingParams(
        temperature=r.temperature if o.temperature is None else o.temperature,
        top_p=r.top_p if o.top_p is None else o.top_p,
        max_new_tokens=r.max_new_tokens if o.max_new_tokens is None else o.max_new_tokens,
        stop=tuple(r.stop if o.stop is None else o.stop),
    )


def prompt_options(cfg: TrainConfig, agents: Sequence[str]) -> dict[str, Any]:
    """How the run builds prompts (keyword arguments of `rollout` and `evaluate_team`): cap, cut side, template."""
    return {
        "max_prompt_tokens": cfg.rollout.max_prompt_tokens,
        "template_kwargs": {a: cfg.template_kwargs(a) for a in agents},
        "truncation": cfg.rollout.truncation,
    }


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
    truncation: Truncation = "middle",
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


def _per_agent(calls: Sequence[Sequence[CallRecord]], agents: Sequence[str]) -> dict[str, dict[str, float]]:
    """Each agent's well-formed share of its calls and their mean response length (agents with calls only)."""
    flat = [c for episode in calls for c in episode]
    out = {}
    for agent in agents:
        mine = [c for c in flat if c.agent == agent]
        if mine:
            out[agent] = {
                "valid": float(np.mean([c.valid for c in mine])),
                "response_tokens": float(np.mean([len(c.response_ids) for c in mine])),
            }
    return out


def evaluate_team(
    envs: Sequence[Any],
    serving: Mapping[str, Policy],
    sampling: Mapping[str, SamplingParams],
    cfg: EvalConfig,
    *,
    max_prompt_tokens: int,
    template_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    truncation: Truncation = "middle",
) -> dict[str, Any]:
    """Run the validation protocol (module docstring) and return its result.

    Args:
        envs: at least `min(batch_episodes, n_problems * k)` envs of the held-out set (reset here).
        serving: agent -> the policy that serves it (the training engines, current weights).
        sampling: agent -> its training sampling settings (only the response caps and stop strings are kept).
        cfg: the protocol.
        max_prompt_tokens: as in training.
        template_kwargs: agent -> chat-template variables, as in training (e.g. enable_thinking=False).
        truncation: which part of an over-long prompt is cut, as in training.

    Returns:
        The sampled pass in `drmas_envs.evaluate.summarise`'s shape ({"avg@k", "pass@k", "n_problems",
        "by_source"}), plus "k", "agents" (agent -> {"valid", "response_tokens"}), the Verifier's
        "approve_right" / "approve_wrong" where the env reports verdicts, "grade/checks", "grade/errors" and
        "grade/over_budget" of both passes where it counts its grades, and with `cfg.greedy` "greedy":
        the greedy pass in the same shape at k = 1, with "answer_acc" where the env reports it;
        "weight_versions": the versions of the weights that served its calls (`CallRecord.weight_version`;
        one, when no weights were pushed while it ran).

    """
    probe = envs[0].unwrapped
    env_id = type(probe).__name__
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
    out: dict[str, Any] = {**summarise(*tally(results, owners, env_id), cfg.k), "k": cfg.k}
    out["agents"] = _per_agent(calls, agents)
    out.update(verdict_metrics(results))
    graded = list(results)
    versions = {c.weight_version for episode in calls for c in episode}
    if cfg.greedy:
        greedy = {a: replace(s, temperature=0.0, top_p=1.0) for a, s in sampling.items()}
        results, calls, owners = _run(envs, problems, 1, serving, greedy, seed=cfg.seed * 7919 + 2, **run)
        versions |= {c.weight_version for episode in calls for c in episode}
        out["greedy"] = summarise(*tally(results, owners, env_id), 1)
        loose = [r.info["loose_correct"] for r in results if "loose_correct" in r.info]
        if loose:
            out["greedy"]["answer_acc"] = float(np.mean(loose))
        graded += results
    out.update(grade_metrics(graded))  # both passes' grades: a failure shows, never stops validation
    out["weight_versions"] = sorted(v for v in versions if v is not None)  # [] where engines are not versioned
    return out


def metrics_row(result: Mapping[str, Any]) -> dict[str, float]:
    """`evaluate_team`'s result as the `val/*` metrics the trainer logs (metrics.jsonl)."""
    k = result["k"]
    row = {f"val/avg@{k}": result[f"avg@{k}"], f"val/pass@{k}": result[f"pass@{k}"]}
    for src, stats in result["by_source"].items():
        row[f"val/{src}/avg@{k}"] = stats[f"avg@{k}"]
    for agent, stats in result["agents"].items():
        row[f"val/valid/{agent}"] = stats["valid"]
        row[f"val/response_tokens/{agent}"] = stats["response_tokens"]
    for key in ("approve_right", "approve_wrong", "grade/checks", "grade/errors", "grade/over_budget"):
        if key in result:
            row[f"val/{key}"] = result[key]
    if "greedy" in result:
        row["val/avg@1"] = result["greedy"]["avg@1"]
        if "answer_acc" in result["greedy"]:
            row["val/answer_acc"] = result["greedy"]["answer_acc"]
    row["val/n_problems"] = float(result["n_problems"])
    if len(result.get("weight_versions", [])) == 1:
        row["val/weight_version"] = float(result["weight_versions"][0])
    return row


def make_eval_envs(env_id: str, env_kwargs: Mapping[str, Any], cfg: EvalConfig) -> list[Any]:
    """The held-out envs validation steps in lock-step (as many as one batch needs)."""
    kwargs = held_out_kwargs(env_kwargs, cfg)
    n = min(cfg.batch_episodes, cfg.n_problems * cfg.k)
    n = max(cfg.k, n - n % cfg.k)
    return [drmas_envs.make(env_id, **kwargs) for _ in range(n)]
