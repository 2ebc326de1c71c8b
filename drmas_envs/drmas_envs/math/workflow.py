r"""The math workflows: a Solver alone, and the Solver-Verifier loop of the paper.

Turn order of `math-2agent`, with `max_loops = L` (default 2):

    Solver -> Verifier -> (reject) Solver -> Verifier -> ... -> (reject) Solver

A *loop* is one Solver attempt. Every attempt except the L-th is reviewed by the Verifier; an
approval ends the episode, a rejection starts the next attempt. The L-th attempt is final and
not reviewed (a review could no longer change anything). So an episode makes at most L Solver
calls and L - 1 Verifier calls: with L = 2, Solver, Verifier, Solver, as in the paper. With L = 1
the Verifier never acts.

Format rules (a malformed call costs its agent `format_penalty`, the episode goes on):

- Solver: well-formed iff its output has a closed `\boxed{...}` holding an answer (an empty box,
  `\boxed{\ldots}`, `\boxed{answer}` or `\boxed{?}` is malformed). The graded answer is the last
  box of the *last* Solver call; if that call is malformed the episode grades wrong.
- Verifier: well-formed iff its last `<verify>...</verify>` tag says approve or reject and no tag
  disagrees. A malformed or missing verdict counts as `missing_verdict` ("approve" by default, as in
  the paper's code; "reject" asks for another attempt). With `verdict_parsing = "reference"` the
  reference code's reading applies instead: a call is well-formed iff it holds `<verify>` and
  `</verify>`, and `<verify>approve</verify>` anywhere approves, even beside a rejecting tag.

With `verifier_mode = "recompute"` (the paper's is "judge": a verdict tag) the Verifier does not
judge the attempt: it solves the problem itself, without seeing the attempt, and its answer decides
the verdict: approve iff it is equivalent to the attempt's answer (an attempt without an answer is
rejected; a Verifier reply without an answer is malformed and counts as `missing_verdict`). Checking
by solving again is for models too small to judge an attempt but able to solve the problem (the cpu
preset; benchmarks/results/cpu_default/README.md, "The Verifier, three ways").

With `review_malformed = False` (True by default, as in the paper) a malformed attempt is not
shown to the Verifier: the next attempt follows at once (the last attempt still ends the episode).
The Verifier then only judges answers, so it cannot learn that "reject" is right merely because an
untrained Solver's attempts mostly have no answer (it can still learn it while most boxed answers are
wrong: benchmarks/results/cpu_default/README.md).

With `verdict_reward = w > 0` (0 by default, as in the paper) a Verifier call also earns `w` when
its verdict is right: approve an attempt that grades right, reject one that grades wrong (a
malformed verdict earns nothing). The team reward alone barely tells the Verifier which verdicts
are right (rejecting a right attempt costs nothing when the retry is right too), so a small judging
Verifier can settle on one verdict for every attempt, with or without this reward
(benchmarks/results/cpu_default/README.md).

Each Verifier call carries a stratum (`Score.call_stratum`): "right" or "wrong", the grade of the
attempt it reviewed. A learner can balance over it (`drmas-train`'s `algo.balance_strata`) so that a
Verifier which cannot yet tell the two apart is not pushed toward the majority verdict.

The score's facts (`infos`) also grade every attempt (`attempts_correct`, so a verdict can be judged
against the attempt it reviewed) and the last number of the last attempt, boxed or not
(`loose_correct`: does the model know the answer, format aside); neither changes the reward. They
also count the outcomes of the checks against the reference (`grades`: right, wrong, over_budget, error;
`drmas_envs.math.grading`) and name each reference whose check was an error with why (`grade_errors`),
so that a grader failure never passes as a wrong answer. A recomputing Verifier's comparison of two
answers is not counted (neither side is a reference).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from drmas_envs.choices import VerdictParsing
from drmas_envs.math import prompts as P
from drmas_envs.math.answers import (
    Verdict,
    clip_middle,
    extract_answer,
    extract_verdict,
    last_number,
    reference_verdict,
)
from drmas_envs.math.grading import OUTCOMES, outcome_of
from drmas_envs.workflow import Parsed, PromptTemplate, Score, Workflow

VerifierMode = Literal["judge", "recompute"]
"""How the math Verifier checks an attempt (`verifier_mode`)."""

Grade = Callable[[str | None, str], bool]


@dataclass(frozen=True)
class MathRules:
    """The episode rules of one math env, fixed for its episodes (`MathEnvConfig` documents each)."""

    grade: Grade
    """Grades (answer, reference): a bool, or a `grading.Grade` whose outcome says over budget or error."""
    check_references: Callable[[list[str]], dict] | None = None
    """Parses references alone (`Grader.check_references`): what a run records at start; None for a
    grader that cannot tell (a plain callable)."""
    max_loops: int = 2
    """Most Solver attempts; 1 for the Solver alone."""
    missing_verdict: Verdict = "approve"
    """What a missing or malformed verdict counts as."""
    max_context_chars: int = 4000
    """Each earlier output shown in a prompt is clipped to this many characters (0: not clipped)."""
    verdict_reward: float = 0.0
    """Added to a Verifier call's reward when its verdict is right."""
    review_malformed: bool = True
    """Show a malformed attempt to the Verifier."""
    verifier_mode: VerifierMode = "judge"
    """"judge" (a verdict tag) or "recompute" (the Verifier solves the problem; answers compared)."""
    verdict_parsing: VerdictParsing = "strict"
    """"strict" (the last tag counts; disagreeing tags are malformed) or "reference" (tags present is
    well-formed; an approving tag anywhere wins)."""


class MathSolo(Workflow):
    """One Solver call per episode: the single-agent baseline (`math-1agent`)."""

    roles = ("solver",)
    default_prompts = P.DEFAULT_PROMPTS
    max_calls = 1

    def __init__(
        self, task: Mapping[str, Any], *, rules: MathRules, prompts: Mapping[str, PromptTemplate] | None = None
    ):
        super().__init__(task, prompts=prompts)
        self.rules = rules
        self._grades = dict.fromkeys(OUTCOMES, 0)
        self._grade_errors: dict[str, str] = {}

    def _grade(self, answer: str | None, reference: str) -> bool:
        """Grade `answer` against the task's reference, counting the outcome (`grades` in the score's facts)."""
        result = self.rules.grade(answer, reference)
        outcome = outcome_of(result)
        self._grades[outcome] += 1
        if outcome == "error":
            self._grade_errors.setdefault(reference, str(getattr(result, "reason", "")))
        return outcome == "right"

    def first_role(self) -> str:
        return "solver"

    def parse(self, role: str, text: str) -> Parsed:
        answer, error = extract_answer(text)
        return Parsed(answer is not None, answer, error)

    def transition(self, role: str, parsed: Parsed) -> str | None:
        return None

    def context(self, role: str) -> dict[str, Any]:
        solver_calls = self.calls_of("solver")
        clip = self.rules.max_context_chars
        history = ""
        if self.history:
            counts: dict[str, int] = {}
            parts = [P.HISTORY_HEADER]
            for call in self.history:
                counts[call.role] = counts.get(call.role, 0) + 1
                label = P.ROLE_LABELS.get(call.role, call.role).format(n=counts[call.role])
                parts.append(P.HISTORY_ENTRY.format(label=label, text=clip_middle(call.text, clip)))
            history = "".join(parts)
        return {
            "problem": self.task["problem"],
            "history": history,
            "latest_solution": clip_middle(solver_calls[-1].text, clip) if solver_calls else "",
            "attempt": len(solver_calls) + (role == "solver"),
            "max_loops": self.rules.max_loops,
        }

    def score(self) -> Score:
        grade = self._grade
        self._grades, self._grade_errors = dict.fromkeys(OUTCOMES, 0), {}  # the counts of this scoring
        solver_calls = self.calls_of("solver")
        answer = solver_calls[-1].parsed.value if solver_calls else None
        reference = str(self.task["answer"])
        # Every attempt graded once (the last one is the team's answer), so a Verifier's verdict can be
        # judged against the attempt it reviewed (review i follows attempt i).
        attempts = [grade(c.parsed.value, reference) if c.parsed.valid else False for c in solver_calls]
        correct = attempts[-1] if attempts else False
        # The loose grade reads the last number of the last attempt; graded only when it differs from the box.
        loose = last_number(solver_calls[-1].text) if solver_calls else None
        loose_correct = correct if loose is not None and loose == answer else bool(loose and grade(loose, reference))
        info = {
            "correct": correct,
            "answer": answer,
            "reference": reference,
            "verdicts": self._verdicts_per_attempt(),
            "attempts_correct": attempts,
            "loose_correct": loose_correct,
            "grades": dict(self._grades),
            "grade_errors": [{"reference": r, "reason": why} for r, why in self._grade_errors.items()],
        }
        return Score(float(correct), info, **self._per_call(attempts))

    def _verdicts_per_attempt(self) -> list[str | None]:
        """The verdict on each reviewed attempt: none without a Verifier."""
        return []

    def _per_call(self, attempts: list[bool]) -> dict[str, tuple]:
        """`Score`'s per-call extras (bonus, strata): none without a Verifier."""
        return {}


class MathTeam(MathSolo):
    """Solver -> Verifier -> (on reject) Solver ..., up to `max_loops` Solver attempts (`math-2agent`).

    The Verifier's rules live here: its verdicts (a tag, or a recomputed answer), which attempts it
    reviews, the bonus for a right verdict and the stratum of each review.
    """

    roles = ("solver", "verifier")

    def parse(self, role: str, text: str) -> Parsed:
        if role == "solver":
            return super().parse(role, text)
        if self.rules.verifier_mode == "recompute":
            return self._recomputed_verdict(text)
        if self.rules.verdict_parsing == "reference":
            found, valid, error = reference_verdict(text)
            return Parsed(valid, found or self.rules.missing_verdict, error)
        verdict, error = extract_verdict(text)
        return Parsed(verdict is not None, verdict if verdict is not None else self.rules.missing_verdict, error)

    def _recomputed_verdict(self, text: str) -> Parsed:
        """The verdict of a Verifier that solved the problem itself: approve iff its answer equals the attempt's."""
        answer, error = extract_answer(text)
        if answer is None:
            return Parsed(False, self.rules.missing_verdict, error)
        attempt = self.calls_of("solver")[-1].parsed
        agrees = attempt.valid and bool(self.rules.grade(answer, str(attempt.value)))
        return Parsed(True, "approve" if agrees else "reject")

    def transition(self, role: str, parsed: Parsed) -> str | None:
        if role == "solver":
            if len(self.calls_of("solver")) >= self.rules.max_loops:
                return None
            return "verifier" if parsed.valid or self.rules.review_malformed else "solver"
        return None if parsed.value == "approve" else "solver"

    def _per_call(self, attempts: list[bool]) -> dict[str, tuple]:
        return {"call_bonus": self._verdict_bonus(attempts), "call_stratum": self._review_strata(attempts)}

    def _reviews(self) -> list[tuple[int, int]]:
        """(attempt index, history index) of each Verifier call: a review judges the latest attempt."""
        out, attempt = [], -1
        for i, call in enumerate(self.history):
            attempt += call.role == "solver"
            if call.role == "verifier":
                out.append((attempt, i))
        return out

    def _verdicts_per_attempt(self) -> list[str | None]:
        """The verdict on each attempt but an unreviewed last one (review i follows attempt i); None for
        an attempt skipped without review (malformed, with `review_malformed` off).
        """
        n = len(self.calls_of("solver")) - (bool(self.history) and self.history[-1].role == "solver")
        out: list[str | None] = [None] * n
        for attempt, i in self._reviews():
            out[attempt] = self.history[i].parsed.value
        return out

    def _review_strata(self, attempts: list[bool]) -> tuple[str | None, ...]:
        """Each Verifier call's stratum: "right" or "wrong", the grade of the attempt it reviewed."""
        strata: list[str | None] = [None] * len(self.history)
        for attempt, i in self._reviews():
            strata[i] = "right" if attempts[attempt] else "wrong"
        return tuple(strata)

    def _verdict_bonus(self, attempts: list[bool]) -> tuple[float, ...]:
        """`verdict_reward` for each well-formed Verifier call whose verdict matches the attempt it reviewed."""
        if not self.rules.verdict_reward:
            return ()
        bonus = [0.0] * len(self.history)
        for attempt, i in self._reviews():
            parsed = self.history[i].parsed
            if parsed.valid and (parsed.value == "approve") == attempts[attempt]:
                bonus[i] = self.rules.verdict_reward
        return tuple(bonus)


@dataclass(frozen=True)
class MathWorkflowFactory:
    """Builds one math workflow per episode with fixed rules; what `WorkflowEnv` calls on reset."""

    n_agents: int
    """1: `MathSolo`; 2: `MathTeam`."""
    rules: MathRules
    """The episode rules (a Solver alone makes one attempt whatever `rules.max_loops` says)."""

    @property
    def workflow_class(self) -> type[MathSolo]:
        return MathTeam if self.n_agents == 2 else MathSolo

    @property
    def roles(self) -> tuple[str, ...]:
        return self.workflow_class.roles

    def check_references(self, tasks: Sequence[Mapping[str, Any]]) -> dict | None:
        """Every distinct reference answer of `tasks` the fast path cannot settle, parsed alone
        (`Grader.check_references`); None when the grader cannot tell.
        """
        if self.rules.check_references is None:
            return None
        return self.rules.check_references([str(t["answer"]) for t in tasks])

    @property
    def max_calls(self) -> int:
        """The most calls an episode can make: L Solver and L - 1 Verifier calls."""
        return 2 * self.rules.max_loops - 1 if self.n_agents == 2 else 1

    def __call__(self, task: Mapping[str, Any], *, prompts: Mapping[str, PromptTemplate] | None = None) -> MathSolo:
        rules = self.rules if self.n_agents == 2 else replace(self.rules, max_loops=1)
        return self.workflow_class(task, rules=rules, prompts=prompts)
