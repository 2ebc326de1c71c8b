"""The workflow base: a multi-agent text workflow as a small state machine.

A workflow is one episode of team work on one task. It answers five questions, and
`drmas_envs.env.WorkflowEnv` turns any workflow into a PettingZoo AEC environment from them:

1. who acts first (`first_role`),
2. what a role sees (`context`, rendered through the role's `PromptTemplate`),
3. whether a role's output is well-formed and what it says (`parse`),
4. who acts next, or whether the episode is over (`transition`),
5. how the team did (`score`).

The turn order *is* the orchestration: sequential, conditional and looping workflows are all
just `transition` functions. Prompt text lives in templates, apart from the logic, and can be
overridden per role when the env is made. See `docs/workflows.md` for a worked example.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class PromptTemplate:
    """The [system, user] chat one role sees; `user` is a `str.format` template over the context.

    `reply_prefix` is the start of the role's reply, written for it: the policy continues it (the
    trainer appends its tokens to the prompt) and the env parses `reply_prefix + action`. A small
    model that rarely opens the required tag on its own writes a valid verdict every time once the tag
    is opened for it (benchmarks/results/cpu_default/README.md, "Verdict tags"). Empty by default: the
    model writes its whole reply.
    """

    system: str
    user: str
    reply_prefix: str = ""

    def render(self, context: Mapping[str, Any]) -> tuple[str, str]:
        """Fill the user template. Only the template is parsed: values are inserted verbatim."""
        return self.system, self.user.format_map(context)


@dataclass(frozen=True)
class Parsed:
    """What a format check made of one call's text.

    Attributes:
        valid: whether the output followed the role's format; a malformed call is penalised.
        value: what the call said (a verdict, an answer, a query), or None.
        error: why the output is malformed, for trajectory logs.

    """

    valid: bool
    value: Any = None
    error: str = ""


@dataclass(frozen=True)
class Call:
    """One model call in an episode: who acted, what it wrote, what the format check made of it."""

    role: str
    text: str
    parsed: Parsed


@dataclass(frozen=True)
class Score:
    """The team's result at the end of an episode: a reward shared by every agent, the outcome, and facts.

    Attributes:
        reward: the team reward (format penalties are the env's business, not the workflow's).
        info: facts for the final infos (answer, reference, ...).
        correct: whether the team got the task right; None means `reward >= 1`, the rule of the
            built-in envs (1 for a right answer). Set it when the reward is graded (F1, partial credit).
        call_bonus: an extra reward per call, in `history` order (empty: none), added to that call's
            reward and its agent's; for an agent-specific term beside the shared reward (the math team's
            `verdict_reward`). It never changes the outcome.
        call_stratum: a label per call, in `history` order (empty: none; None for an unlabelled call),
            naming the situation the call acted in when its reward's base rate depends on it (the math
            Verifier's: "right" or "wrong", the grade of the attempt it reviewed). A fact for learners
            that balance over it (`drmas-train`'s `algo.balance_strata`); it never changes a reward.

    """

    reward: float
    info: dict[str, Any] = field(default_factory=dict)
    correct: bool | None = None
    call_bonus: tuple[float, ...] = ()
    call_stratum: tuple[str | None, ...] = ()

    @property
    def outcome(self) -> bool:
        """The team's outcome: `correct` if the workflow set it, else `reward >= 1`."""
        return bool(self.correct) if self.correct is not None else float(self.reward) >= 1.0


class Workflow(ABC):
    """Base class of a multi-agent workflow; one instance is one episode on one task.

    Subclasses set `roles` (the agent names, fixed for the env) and `default_prompts`, and
    implement the abstract methods. State lives on the instance; `history` holds every call.

    Args:
        task: one dataset item (for example `{"problem": ..., "answer": ...}`).
        prompts: per-role template overrides; roles not named keep `default_prompts`.

    """

    roles: ClassVar[tuple[str, ...]] = ()
    default_prompts: ClassVar[Mapping[str, PromptTemplate]] = {}
    max_calls: ClassVar[int] = 16
    """A hard cap on calls per episode; reaching it truncates the episode (a safety net)."""

    def __init__(self, task: Mapping[str, Any], *, prompts: Mapping[str, PromptTemplate] | None = None):
        self.task = dict(task)
        self.prompts = {**self.default_prompts, **(prompts or {})}
        missing = [r for r in self.roles if r not in self.prompts]
        if missing:
            raise ValueError(f"{type(self).__name__}: no prompt template for roles {missing}")
        self.history: list[Call] = []

    # -- what subclasses implement -------------------------------------------------------
    @abstractmethod
    def first_role(self) -> str:
        """The role that acts first."""

    @abstractmethod
    def parse(self, role: str, text: str) -> Parsed:
        """Check one output's format and extract what it says. Must accept any string."""

    @abstractmethod
    def transition(self, role: str, parsed: Parsed) -> str | None:
        """After `role`'s call (already in `history`), the next role, or None when the episode ends."""

    @abstractmethod
    def context(self, role: str) -> dict[str, Any]:
        """The fields `role`'s user template is filled with, at the current state."""

    @abstractmethod
    def score(self) -> Score:
        """The team reward and facts for `infos`, at the end of the episode."""

    # -- shared machinery ------------------------------------------------------------------
    def messages(self, role: str) -> tuple[str, str]:
        """The (system, user) messages `role` would see now."""
        return self.prompts[role].render(self.context(role))

    def reply_prefix(self, role: str) -> str:
        """The start of `role`'s reply that is written for it (see `PromptTemplate.reply_prefix`)."""
        return self.prompts[role].reply_prefix

    def record(self, role: str, text: str) -> Parsed:
        """Parse one call, append it to `history`, and return the parse."""
        parsed = self.parse(role, text)
        self.history.append(Call(role, text, parsed))
        return parsed

    def calls_of(self, role: str) -> list[Call]:
        """The calls `role` made so far, in order."""
        return [c for c in self.history if c.role == role]
