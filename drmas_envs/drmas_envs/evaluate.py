"""`evaluate`: avg@k and pass@k of any policy on any registered env, overall and per data source.

The metrics of every evaluation in the project (`drmas-envs eval`, `drmas-train eval` and validation
during training) come from `summarise`. With n episodes drawn per problem, c of them correct:

- avg@k is the mean over problems of c / n, the share of correct episodes;
- pass@k is the mean over problems of 1 - C(n-c, k) / C(n, k), the chance that k episodes drawn without
  replacement from the n hold a correct one (the unbiased estimator of Chen et al. 2021); with n = k it is
  whether any episode is correct.

An episode is correct when the env says so: its final infos' `correct` (the team's outcome, format
penalties aside; see `drmas_envs.env`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from drmas_envs.lockstep import EpisodeResult, run_lockstep
from drmas_envs.registry import make

Policy = Callable[[str, list[dict[str, Any]]], list[str]]
"""`policy(agent, observations) -> actions`: answers a batch of one agent's observations."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem: n episodes drawn, c of them correct.

    Raises:
        ValueError: fewer than k episodes, or c outside [0, n].

    """
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)  # exact integers: no cancellation for large n


def summarise(correct: Mapping[Hashable, Sequence[bool]], sources: Mapping[Hashable, str], k: int) -> dict[str, Any]:
    """avg@k and pass@k (module docstring) overall and per data source.

    Args:
        correct: problem -> the outcome of each of its episodes (at least k).
        sources: problem -> its data source ("default" when the env names none).
        k: the k of the metrics.

    Returns:
        {"avg@k", "pass@k", "n_problems", "by_source": {source: {"avg@k", "pass@k", "n_problems"}}}.

    """

    def stats(problems: Sequence[Hashable]) -> dict[str, float]:
        avg = sum(sum(correct[p]) / len(correct[p]) for p in problems) / len(problems)
        passed = sum(pass_at_k(len(correct[p]), sum(correct[p]), k) for p in problems) / len(problems)
        return {f"avg@{k}": avg, f"pass@{k}": passed, "n_problems": len(problems)}

    if not correct:
        raise ValueError("no problems to summarise")
    by_source: dict[str, list[Hashable]] = defaultdict(list)
    for p in correct:
        by_source[sources.get(p, "default")].append(p)
    return {**stats(list(correct)), "by_source": {s: stats(ps) for s, ps in sorted(by_source.items())}}


def outcome(result: EpisodeResult, env_id: str) -> bool:
    """The episode's outcome as the env reported it; an env without one is an error, not a zero."""
    if "correct" not in result.info:
        raise ValueError(f"env {env_id!r} reports no outcome: its final infos lack 'correct' (see drmas_envs.env)")
    return bool(result.info["correct"])


def tally(
    results: Sequence[EpisodeResult], problems: Sequence[Hashable], env_id: str
) -> tuple[dict[Hashable, list[bool]], dict[Hashable, str]]:
    """(problem -> outcomes, problem -> source) of episodes and the problem each one ran: `summarise`'s input."""
    correct: dict[Hashable, list[bool]] = defaultdict(list)
    sources: dict[Hashable, str] = {}
    for res, p in zip(results, problems, strict=True):
        correct[p].append(outcome(res, env_id))
        sources[p] = str(res.info.get("source", "default"))
    return dict(correct), sources


def evaluate(
    policy: Policy,
    env_id: str,
    *,
    k: int,
    samples: int | None = None,
    n_problems: int | None = None,
    seed: int = 0,
    batch_episodes: int = 256,
    **env_kwargs: Any,
) -> dict[str, Any]:
    """Run `samples` episodes (default `k`) on each of the first `n_problems` problems (in the seed's order).

    Args:
        policy: answers a batch of observations of one agent with one text each.
        env_id: a registered env id.
        k: the k of avg@k and pass@k.
        samples: episodes per problem, at least k; more than k makes pass@k the unbiased estimate.
        n_problems: how many problems; None for all.
        seed: fixes which problems come first.
        batch_episodes: how many episodes run in lock-step at once (bounds memory).
        **env_kwargs: passed to `make` (dataset, split, ...).

    Returns:
        `summarise`'s result: {"avg@k", "pass@k", "n_problems", "by_source"}; rates are in [0, 1].

    """
    samples = k if samples is None else samples
    if k < 1 or samples < k:
        raise ValueError(f"k must be at least 1 and samples at least k, got k={k}, samples={samples}")
    probe = make(env_id, **env_kwargs)
    order = probe.unwrapped.task_order(seed)
    problems = order[: n_problems if n_problems is not None else len(order)]
    jobs = [p for p in problems for _ in range(samples)]
    results: list[EpisodeResult] = []
    for start in range(0, len(jobs), batch_episodes):
        chunk = jobs[start : start + batch_episodes]
        envs = [make(env_id, **env_kwargs) for _ in chunk]
        for env, p in zip(envs, chunk):
            env.reset(seed=seed, options={"task_index": p})
        results.extend(run_lockstep(envs, lambda agent, idx, obs: list(policy(agent, obs))))
    return summarise(*tally(results, jobs, env_id), k)


def result_table(result: Mapping[str, Any], k: int) -> str:
    """`summarise`'s result as a plain-text table: one row overall, one per data source."""
    rows = [("all", result)] + list(result["by_source"].items())
    width = max(len(name) for name, _ in rows)
    lines = [f"{'source':<{width}}  {'problems':>8}  {f'avg@{k}':>8}  {f'pass@{k}':>8}"]
    for name, r in rows:
        lines.append(f"{name:<{width}}  {r['n_problems']:>8}  {r[f'avg@{k}']:>8.4f}  {r[f'pass@{k}']:>8.4f}")
    return "\n".join(lines)
