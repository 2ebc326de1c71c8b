"""`evaluate`: avg@k and pass@k of any policy on any registered env, overall and per data source.

avg@k is the mean over problems of the fraction of the k episodes that are correct; pass@k is the
fraction of problems with at least one correct episode among k. An episode is correct when the env
says so: its final infos' `correct` (the team's outcome, format penalties aside; see `drmas_envs.env`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from drmas_envs.lockstep import EpisodeResult, run_lockstep
from drmas_envs.registry import make

Policy = Callable[[str, list[dict[str, Any]]], list[str]]
"""`policy(agent, observations) -> actions`: answers a batch of one agent's observations."""


def _summarise(correct: dict[int, list[bool]], sources: dict[int, str], k: int) -> dict[str, Any]:
    def stats(problems: Sequence[int]) -> dict[str, float]:
        avg = sum(sum(correct[p]) / len(correct[p]) for p in problems) / len(problems)
        passed = sum(any(correct[p]) for p in problems) / len(problems)
        return {f"avg@{k}": avg, f"pass@{k}": passed, "n_problems": len(problems)}

    by_source: dict[str, list[int]] = defaultdict(list)
    for p, src in sources.items():
        by_source[src].append(p)
    return {**stats(list(correct)), "by_source": {s: stats(ps) for s, ps in sorted(by_source.items())}}


def _outcome(result: EpisodeResult, env_id: str) -> bool:
    """The episode's outcome as the env reported it; an env without one is an error, not a zero."""
    if "correct" not in result.info:
        raise ValueError(f"env {env_id!r} reports no outcome: its final infos lack 'correct' (see drmas_envs.env)")
    return bool(result.info["correct"])


def evaluate(
    policy: Policy,
    env_id: str,
    *,
    k: int,
    n_problems: int | None = None,
    seed: int = 0,
    batch_episodes: int = 256,
    **env_kwargs: Any,
) -> dict[str, Any]:
    """Run `k` episodes on each of the first `n_problems` problems (in the seed's order).

    Args:
        policy: answers a batch of observations of one agent with one text each.
        env_id: a registered env id.
        k: episodes per problem.
        n_problems: how many problems; None for all.
        seed: fixes which problems come first.
        batch_episodes: how many episodes run in lock-step at once (bounds memory).
        **env_kwargs: passed to `make` (dataset, split, ...).

    Returns:
        {"avg@k", "pass@k", "n_problems", "by_source": {source: {...}}}; rates are in [0, 1].

    """
    if k < 1:
        raise ValueError("k must be at least 1")
    probe = make(env_id, **env_kwargs)
    order = probe.unwrapped.task_order(seed)
    problems = order[: n_problems if n_problems is not None else len(order)]
    jobs = [p for p in problems for _ in range(k)]
    correct: dict[int, list[bool]] = {p: [] for p in problems}
    sources: dict[int, str] = {}
    for start in range(0, len(jobs), batch_episodes):
        chunk = jobs[start : start + batch_episodes]
        envs = [make(env_id, **env_kwargs) for _ in chunk]
        for env, p in zip(envs, chunk):
            env.reset(seed=seed, options={"task_index": p})
        results = run_lockstep(envs, lambda agent, idx, obs: list(policy(agent, obs)))
        for p, res in zip(chunk, results):
            correct[p].append(_outcome(res, env_id))
            sources[p] = str(res.info.get("source", "default"))
    return _summarise(correct, sources, k)
