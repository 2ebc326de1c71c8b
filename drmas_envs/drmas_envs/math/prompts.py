r"""Prompt text of the math envs, kept apart from the logic.

Override per role with `make("math-2agent", prompts={"verifier": PromptTemplate(system, user)})`
(or plain dicts {"system": ..., "user": ...}). User templates are `str.format` templates over:

- `{problem}`: the problem text;
- `{history}`: the team's earlier outputs, oldest first, each clipped to `max_context_chars`
  (rendered with `HISTORY_HEADER` and `HISTORY_ENTRY` below; "" on the first call);
- `{latest_solution}`: the Solver's latest output, clipped ("" before the first);
- `{attempt}`: the number of this Solver call (1, 2, ...); `{max_loops}`: the loop budget.

Write a literal brace in a user template twice (`\boxed{{}}` shows as `\boxed{}`); values are inserted
verbatim, never parsed as templates.

Two layouts (`make(..., prompt_layout=...)`): "project" (the default) gives each role its instructions and
a worked example in the system message; "reference" is the reference code's message layout, in this
project's words: a generic system message, and the task, the team's work and the role's instructions in
the user message, with no worked examples. `prompts_file` loads any other set (`drmas_envs.prompt_files`).
"""

from __future__ import annotations

from typing import Literal

from drmas_envs.workflow import PromptTemplate

# The worked examples in the system prompts are there for small models: without one SmolLM2-135M almost
# never boxes its answer, so every graded reward is 0 and RL has nothing to learn from; with one it boxes
# about half of them (docs/math.md, benchmarks/results/math_levels_smollm2.md). They cost a large model nothing.
SOLVER = PromptTemplate(
    system=(
        "You are the Solver in a math team. Solve the problem step by step, then give the final answer "
        "in \\boxed{}.\n\nExample:\nProblem: What is $2 + 5$?\nSolution: 2 + 5 = 7. The final answer is \\boxed{7}."
    ),
    user="Problem:\n{problem}\n\n{history}Solve the problem. End with your final answer in \\boxed{{}}.",
)

VERIFIER = PromptTemplate(
    system=(
        "You are the Verifier in a math team. Check the Solver's latest solution step by step. "
        "End with exactly one verdict: <verify>approve</verify> if the final answer is correct, "
        "or <verify>reject</verify> if it is wrong, with a short reason before it.\n\n"
        "Examples:\nSolver: 2 + 5 = 7. The final answer is \\boxed{7}.\nReview: 2 + 5 is 7. <verify>approve</verify>\n"
        "Solver: 2 + 5 = 8. The final answer is \\boxed{8}.\nReview: 2 + 5 is 7, not 8. <verify>reject</verify>"
    ),
    user=(
        "Problem:\n{problem}\n\n{history}Review the Solver's latest solution. "
        "End with <verify>approve</verify> or <verify>reject</verify>."
    ),
)

# The verdict first, then the reason (`make(..., verdict_first=True)`), with the tag opened for the
# model (`reply_prefix`): the policy only chooses `approve` or `reject`. A small model that rambles
# runs out of tokens before a closing verdict, or never opens the tag; with the prefix every reply
# holds one (SmolLM2-135M's figures: benchmarks/results/cpu_default/README.md, "Verdict tags"). A large
# model loses its reasoning-before-verdict, so this is not the default.
VERIFIER_VERDICT_FIRST = PromptTemplate(
    system=(
        "You are the Verifier in a math team. Check whether the Solver's final answer is correct. "
        "Reply with the verdict first: <verify>approve</verify> if the final answer is correct, or "
        "<verify>reject</verify> if it is wrong. Then give a short reason.\n\n"
        "Examples:\nProblem: What is $2 + 5$?\nSolver: 2 + 5 = 7. The final answer is \\boxed{7}.\n"
        "Review: <verify>approve</verify> 2 + 5 is 7.\n"
        "Problem: What is $2 + 5$?\nSolver: 2 + 5 = 8. The final answer is \\boxed{8}.\n"
        "Review: <verify>reject</verify> 2 + 5 is 7, not 8."
    ),
    user=(
        "Problem:\n{problem}\n\nSolver:\n{latest_solution}\n\nReview the Solver's final answer. "
        "Start with <verify>approve</verify> or <verify>reject</verify>."
    ),
    reply_prefix="<verify>",
)

# `make(..., verifier_mode="recompute")`: the Verifier solves the problem without seeing the attempt; the
# env approves the attempt iff the answers agree. The attempt is left out on purpose: a Verifier that can
# read it can copy its answer, which approves everything.
VERIFIER_RECOMPUTE = PromptTemplate(
    system=(
        "You are the Verifier in a math team. The Solver has answered the problem below. Check it by "
        "solving the problem yourself: the Solver's answer is approved if it equals yours. Solve step by "
        "step, then give your final answer in \\boxed{}.\n\nExample:\nProblem: What is $2 + 5$?\n"
        "Check: 2 + 5 = 7. The final answer is \\boxed{7}."
    ),
    user="Problem:\n{problem}\n\nSolve the problem to check the Solver's answer. End with your answer in \\boxed{{}}.",
)

DEFAULT_PROMPTS = {"solver": SOLVER, "verifier": VERIFIER}

GENERIC_SYSTEM = "You are a helpful assistant."
"""The system message of the "reference" layout: the role lives in the user message."""

_TEAM_TASK = "You are one of a team of agents solving a math problem together.\n\nThe problem:\n{problem}\n\n"

REFERENCE_SOLVER = PromptTemplate(
    system=GENERIC_SYSTEM,
    user=_TEAM_TASK + "{history}Your role: the Solver. Work through the problem step by step. If a teammate has "
    "reviewed an earlier attempt, take the review into account. Put your final answer in \\boxed{{}} at the end.",
)

REFERENCE_VERIFIER = PromptTemplate(
    system=GENERIC_SYSTEM,
    user=_TEAM_TASK + "{history}Your role: the Verifier. Go through the Solver's most recent solution and check "
    "every step, every calculation and the final answer. Close your reply with exactly one verdict: "
    "<verify>approve</verify> when the solution and its answer are right, <verify>reject</verify> when you "
    "find any error.",
)

REFERENCE_SOLO = PromptTemplate(
    system=GENERIC_SYSTEM,
    user="The problem:\n{problem}\n\nWork through the problem step by step. "
    "Put your final answer in \\boxed{{}} at the end.",
)
"""The "reference" layout's Solver working alone (`math-1agent`)."""

MathLayout = Literal["project", "reference"]
"""The built-in prompt sets' names (`prompt_layout`): the keys of `LAYOUTS`."""

LAYOUTS: dict[MathLayout, dict[str, PromptTemplate]] = {
    "project": DEFAULT_PROMPTS,
    "reference": {"solver": REFERENCE_SOLVER, "verifier": REFERENCE_VERIFIER},
}
"""The built-in prompt sets, by `prompt_layout`."""

CONTEXT_FIELDS = ("problem", "history", "latest_solution", "attempt", "max_loops")
"""The fields every user template may use (see the module docstring)."""

HISTORY_HEADER = "Your team's work so far:\n\n"
HISTORY_ENTRY = "[{label}]\n{text}\n\n"
ROLE_LABELS = {"solver": "Solver, attempt {n}", "verifier": "Verifier, review {n}"}
