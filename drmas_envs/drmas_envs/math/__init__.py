"""The math task family: `math-1agent` (a Solver) and `math-2agent` (Solver and Verifier)."""

from drmas_envs.math.answers import extract_answer, extract_verdict, last_boxed
from drmas_envs.math.env import MathEnvConfig, math_env
from drmas_envs.math.grading import Grader, default_grader, grade

__all__ = [
    "Grader",
    "MathEnvConfig",
    "default_grader",
    "extract_answer",
    "extract_verdict",
    "grade",
    "last_boxed",
    "math_env",
]
