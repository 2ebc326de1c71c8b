"""`WorkflowEnv`: any `Workflow` as a PettingZoo AEC environment.

One agent acts at a time (the workflow's turn order). Rewards are given once, at the end, and the
env is their one source: the trainer and `evaluate` read them from the final infos, never re-derive.

- Each call: `infos[agent]["calls"][i]` = {`agent`, `valid`, `error`, `penalty`, `bonus`, `reward`,
  `correct`, `stratum`}: `penalty` is `format_penalty[agent]` when the call was malformed, else 0; `bonus` is the
  workflow's extra reward for that call (`Score.call_bonus`, usually 0); `reward` is the team reward
  minus the penalty plus the bonus (the per-call reward Dr. MAS trains on); `correct` is the team's
  outcome, the same for every call of the episode; `stratum` is the workflow's label of the
  situation the call acted in (`Score.call_stratum`, usually None), a fact that never changes a reward.
- Each agent (what `agent_iter()`/`last()` sees): the team reward minus the sum of its calls'
  penalties plus the sum of their bonuses.
- The outcome (`infos[agent]["correct"]`): `Score.correct` when the workflow sets it, else team
  reward >= 1. The built-in envs use the default: math scores 1 iff the graded answer is right,
  search scores exact match (1 or 0), so "correct" means a right answer, penalties aside.

Observations are {`role`, `system`, `user`, `reply_prefix`, `turn`}. `reply_prefix` (usually "") is
the start of the reply written for the agent: a policy continues it, and the env parses
`reply_prefix + action` (see `PromptTemplate.reply_prefix`).

The final `infos` of every agent also hold the score's facts, `team_reward`, calls and malformed
calls per agent, and the agent's own total `format_penalty`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv

from drmas_envs.spaces import AnyText, action_space, observation_space
from drmas_envs.workflow import Call, PromptTemplate, Workflow

Observation = dict[str, Any]


class WorkflowEnv(AECEnv):
    """A multi-agent text workflow over a list of tasks.

    Args:
        workflow: the `Workflow` subclass, or a factory `(task, prompts=...) -> Workflow`.
        tasks: the dataset items; `reset(seed=s)` shuffles their order deterministically by `s`.
        roles: the agent names (defaults to `workflow.roles`).
        format_penalty: subtracted from an agent's reward per malformed call; one number or a
            mapping from agent name to number.
        prompts: per-role `PromptTemplate` overrides.
        max_text_length: the longest action or observation text the spaces admit.
        name: the env name in `metadata`.
        render_mode: None or "ansi" (`render()` returns the transcript as text).

    """

    metadata = {"name": "drmas_workflow_v0", "render_modes": ["ansi"], "is_parallelizable": False}

    def __init__(
        self,
        workflow: type[Workflow] | Callable[..., Workflow],
        tasks: Sequence[Mapping[str, Any]],
        *,
        roles: Sequence[str] | None = None,
        format_penalty: float | Mapping[str, float] = 0.0,
        prompts: Mapping[str, PromptTemplate] | None = None,
        max_text_length: int = 1_000_000,
        name: str | None = None,
        render_mode: str | None = None,
    ):
        super().__init__()
        if not tasks:
            raise ValueError("WorkflowEnv needs at least one task")
        self._factory = workflow
        self.tasks = list(tasks)
        # where the tasks came from (a `TaskSet`'s record), for a trainer's run config
        self.data_provenance: dict[str, Any] = dict(getattr(tasks, "provenance", None) or {})
        self.possible_agents = list(roles if roles is not None else workflow.roles)
        self.format_penalty = self._per_agent(format_penalty)
        self.prompts = dict(prompts or {})
        self.max_calls = int(getattr(workflow, "max_calls", 16))
        self.max_text_length = max_text_length
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}")
        self.render_mode = render_mode
        if name:
            self.metadata = {**self.metadata, "name": name}
        self._order = np.arange(len(self.tasks))
        self._cursor = 0
        self.workflow: Workflow | None = None

    def _per_agent(self, value: float | Mapping[str, float]) -> dict[str, float]:
        if isinstance(value, Mapping):
            unknown = set(value) - set(self.possible_agents)
            if unknown:
                raise ValueError(
                    f"format_penalty names unknown agents {sorted(unknown)}; agents: {self.possible_agents}"
                )
            return {a: float(value.get(a, 0.0)) for a in self.possible_agents}
        return {a: float(value) for a in self.possible_agents}

    # -- spaces ------------------------------------------------------------------------------
    @functools.cache  # noqa: B019 - one space object per agent, as the API test expects
    def observation_space(self, agent: str) -> spaces.Dict:
        return observation_space(self.max_calls, self.max_text_length)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> AnyText:
        return action_space(self.max_text_length)

    # -- task order ----------------------------------------------------------------------------
    def task_order(self, seed: int) -> list[int]:
        """The order in which `reset(seed=seed)` and the resets after it visit the tasks."""
        return np.random.default_rng(seed).permutation(len(self.tasks)).tolist()

    def _next_task(self, seed: int | None, options: Mapping[str, Any]) -> Mapping[str, Any]:
        if "task" in options:
            return options["task"]
        if "task_index" in options:
            return self.tasks[int(options["task_index"])]
        if seed is not None:
            self._order = np.asarray(self.task_order(seed))
            self._cursor = 0
        task = self.tasks[int(self._order[self._cursor % len(self._order)])]
        self._cursor += 1
        return task

    # -- AEC API -------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        """Start an episode on the next task; `options` may pin it with `task_index` or `task`."""
        task = self._next_task(seed, options or {})
        self.workflow = self._factory(task, prompts=self.prompts)
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = self.workflow.first_role()

    def observe(self, agent: str) -> Observation:
        system, user = self.workflow.messages(agent)
        turn = min(len(self.workflow.history), self.max_calls)
        return {
            "role": agent,
            "system": system,
            "user": user,
            "reply_prefix": self.workflow.reply_prefix(agent),
            "turn": turn,
        }

    def step(self, action: str | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        text = action if isinstance(action, str) else ("" if action is None else str(action))
        # The action continues the reply prefix the observation showed (usually ""): parse the whole reply.
        self.workflow.record(agent, self.workflow.reply_prefix(agent) + text)
        next_role = self.workflow.transition(agent, self.workflow.history[-1].parsed)
        self._cumulative_rewards[agent] = 0.0
        self._clear_rewards()
        if next_role is None:
            self._finish(truncated=False)
        elif len(self.workflow.history) >= self.max_calls:
            self._finish(truncated=True)
        else:
            self.agent_selection = next_role
        self._accumulate_rewards()

    def _finish(self, *, truncated: bool) -> None:
        score = self.workflow.score()
        team, correct = float(score.reward), score.outcome
        if isinstance(score.info.get("correct"), bool) and score.info["correct"] != correct:
            raise ValueError(
                f"{type(self.workflow).__name__}.score(): info['correct'] is {score.info['correct']} but the "
                f"outcome is {correct} (reward {team}); set Score(correct=...) to say what a right answer is"
            )
        history = self.workflow.history
        bonus = tuple(float(b) for b in score.call_bonus) or (0.0,) * len(history)
        if len(bonus) != len(history):
            raise ValueError(
                f"{type(self.workflow).__name__}.score(): call_bonus has {len(bonus)} entries for "
                f"{len(history)} calls; give one per call or none"
            )
        strata = tuple(score.call_stratum) or (None,) * len(history)
        if len(strata) != len(history):
            raise ValueError(
                f"{type(self.workflow).__name__}.score(): call_stratum has {len(strata)} entries for "
                f"{len(history)} calls; give one per call or none"
            )
        calls = [self._call_entry(c, team, correct, b, s) for c, b, s in zip(history, bonus, strata, strict=True)]
        n_calls = {a: sum(c.role == a for c in history) for a in self.agents}
        n_bad = {a: sum(c.role == a and not c.parsed.valid for c in history) for a in self.agents}
        summary = {
            **score.info,
            "team_reward": team,
            "correct": correct,
            "calls": calls,
            "calls_per_agent": n_calls,
            "malformed_per_agent": n_bad,
            "truncated": truncated,
            "source": self.workflow.task.get("source", "default"),
        }
        for a in self.agents:
            penalty = sum(c["penalty"] for c in calls if c["agent"] == a)
            self.rewards[a] = team - penalty + sum(c["bonus"] for c in calls if c["agent"] == a)
            self.infos[a] = {**summary, "format_penalty": penalty}
            self.terminations[a] = not truncated
            self.truncations[a] = truncated
        self.agent_selection = self.agents[0]

    def _call_entry(self, call: Call, team: float, correct: bool, bonus: float, stratum: str | None) -> dict[str, Any]:
        """One call's entry in `infos["calls"]`: validity, penalty, bonus, reward, the team's outcome, stratum."""
        penalty = 0.0 if call.parsed.valid else self.format_penalty[call.role]
        return {
            "agent": call.role,
            "valid": call.parsed.valid,
            "error": call.parsed.error,
            "penalty": penalty,
            "bonus": bonus,
            "reward": team - penalty + bonus,
            "correct": correct,
            "stratum": stratum,
        }

    def render(self) -> str | None:
        if self.render_mode is None or self.workflow is None:
            return None
        lines = [f"[{c.role}]{'' if c.parsed.valid else ' (malformed)'} {c.text}" for c in self.workflow.history]
        return "\n".join(lines)

    def close(self) -> None:
        self.workflow = None
