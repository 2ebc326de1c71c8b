r"""A two-agent math debate, written on the workflow base: the worked example of docs/workflows.md.

A Proposer answers; a Critic reads the Proposer's answer and gives its own. When the two latest
answers agree the debate ends; otherwise they take turns again, up to `rounds` rounds (a round is
one Proposer call and one Critic call). Every call must end in a `\boxed{}` answer (else it is
malformed and penalised). The team answer is the last answer given; reward 1 if it is right.

    from drmas_envs.examples.debate import debate_env
    env = debate_env()                                     # generated problems, levels 1-3
    drmas_envs.register("math-debate", "drmas_envs.examples.debate:debate_env")   # optional

Train it: `drmas-train --preset smoke --env drmas_envs.examples.debate:debate_env --steps 1`.
"""

from __future__ import annotations

from typing import Any

from drmas_envs.env import WorkflowEnv
from drmas_envs.math.answers import clip_middle, extract_answer
from drmas_envs.math.datasets import load_tasks
from drmas_envs.math.generated import generate
from drmas_envs.math.grading import default_grader
from drmas_envs.workflow import Parsed, PromptTemplate, Score, Workflow

PROMPTS = {
    "proposer": PromptTemplate(
        system="You solve math problems step by step and end with the final answer in \\boxed{}.",
        user="Problem:\n{problem}\n\n{transcript}Give your answer; end with \\boxed{{}}.",
    ),
    "critic": PromptTemplate(
        system="You check another student's answer to a math problem and end with your own answer in \\boxed{}.",
        user="Problem:\n{problem}\n\n{transcript}Is the latest answer right? End with your answer in \\boxed{{}}.",
    ),
}


class Debate(Workflow):
    """Proposer and Critic take turns until their latest answers agree, at most `rounds` rounds."""

    roles = ("proposer", "critic")
    default_prompts = PROMPTS
    rounds = 2
    max_calls = 2 * rounds  # WorkflowEnv's observation space and safety cap read this

    def first_role(self) -> str:
        return "proposer"

    def parse(self, role: str, text: str) -> Parsed:
        answer, why = extract_answer(text)  # any string in, bounded work
        return Parsed(valid=answer is not None, value=answer, error=why)

    def transition(self, role: str, parsed: Parsed) -> str | None:
        if len(self.history) >= 2 * self.rounds:
            return None
        if role == "critic" and self._latest_agree():
            return None
        return "critic" if role == "proposer" else "proposer"

    def _latest_agree(self) -> bool:
        a, b = (c.parsed.value for c in self.history[-2:])
        return a is not None and b is not None and default_grader()(a, b)

    def context(self, role: str) -> dict[str, Any]:
        lines = [f"[{c.role}]\n{clip_middle(c.text, 2000)}\n\n" for c in self.history]
        transcript = "The debate so far:\n\n" + "".join(lines) if lines else ""
        return {"problem": self.task["problem"], "transcript": transcript}

    def score(self) -> Score:
        answer = self.history[-1].parsed.value if self.history else None
        correct = answer is not None and default_grader()(answer, str(self.task["answer"]))
        return Score(float(correct), {"correct": correct, "answer": answer, "reference": self.task["answer"]})


def debate_env(dataset: str | None = None, split: str | None = None, format_penalty: float = 0.1, **kw: Any):
    """The debate as a PettingZoo AEC env; `dataset` as in the math envs (None: generated problems)."""
    tasks = generate((1, 2, 3), 200) if dataset is None else load_tasks(dataset, split, kw.pop("data_dir", None))
    return WorkflowEnv(Debate, tasks, format_penalty=format_penalty, name="drmas_math_debate_v0", **kw)
