"""Step many AEC envs in lock-step so that a policy answers one batch per agent per turn.

Both `evaluate` and the trainer's rollout use this loop; only the `act` callback differs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pettingzoo import AECEnv

Act = Callable[[str, list[int], list[dict[str, Any]]], list[str]]
"""`act(agent, env_indices, observations) -> actions`, one action per listed env."""

ActRound = Callable[[dict[str, list[int]], dict[str, list[dict[str, Any]]]], dict[str, list[str]]]
"""`act_round(pending, observations) -> actions`: every agent's pending envs of one round at once
(`pending[agent]` lists env indices, `observations[agent]` and the returned `actions[agent]` follow it),
so a policy can batch calls across agents, e.g. all agents that share one model."""


@dataclass
class EpisodeResult:
    """How one env's episode ended: each agent's final reward and final info."""

    rewards: dict[str, float] = field(default_factory=dict)
    infos: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def info(self) -> dict[str, Any]:
        """The episode summary (the same facts are in every agent's info)."""
        return next(iter(self.infos.values()), {})


def _drain(env: AECEnv, result: EpisodeResult) -> bool:
    """Step dead agents with None until a live agent is selected; True when the env is done."""
    while env.agents:
        agent = env.agent_selection
        if not (env.terminations[agent] or env.truncations[agent]):
            return False
        if not result.infos:  # first dead agent: the final rewards and infos are all still there
            result.rewards = {a: float(env.rewards[a]) for a in env.agents}
            result.infos = {a: dict(env.infos[a]) for a in env.agents}
        env.step(None)
    return True


def run_lockstep(
    envs: Sequence[AECEnv], act: Act | None = None, *, act_round: ActRound | None = None
) -> list[EpisodeResult]:
    """Run every (already reset) env to the end, batching the pending calls by agent.

    Args:
        envs: envs after `reset`.
        act: called once per agent per round with every env waiting on that agent.
        act_round: instead of `act`, called once per round with every agent's pending envs.

    Returns:
        One `EpisodeResult` per env, in order.

    """
    if (act is None) == (act_round is None):
        raise ValueError("pass exactly one of act and act_round")
    results = [EpisodeResult() for _ in envs]
    active = list(range(len(envs)))
    while active:
        pending: dict[str, list[int]] = {}
        still = []
        for i in active:
            if _drain(envs[i], results[i]):
                continue
            still.append(i)
            pending.setdefault(envs[i].agent_selection, []).append(i)
        observations = {agent: [envs[i].observe(agent) for i in idx] for agent, idx in pending.items()}
        if act_round is not None:
            answers = act_round(pending, observations) if pending else {}
        else:
            answers = {agent: act(agent, idx, observations[agent]) for agent, idx in pending.items()}
        for agent, idx in pending.items():
            actions = answers.get(agent, [])
            if len(actions) != len(idx):
                raise ValueError(f"policy returned {len(actions)} actions for {len(idx)} observations of {agent!r}")
            for i, action in zip(idx, actions):
                envs[i].step(action)
        active = still
    return results
