r"""Grading: is an extracted answer mathematically equivalent to the reference?

Every check has one of four outcomes (`Grade.outcome`): right, wrong, over_budget (the check ran past a
bound: its CPU time, or the answer's length or nesting), or error (the grader failed: math-verify cannot
parse the reference, a comparison raised, or the worker died twice). An answer math-verify cannot parse
is wrong, the answer's fault; a reference it cannot parse is the data's, an error. `Grade` is truthy iff
right, so `bool(grader.check(a, r))` is the old yes/no.

Two paths, both bounded in time:

1. A fast path in this process: normalised string equality, and exact comparison when both sides
   are plain numbers (integers, decimals, `a/b`, `\frac{a}{b}`). It settles most integer answers in
   microseconds.
2. Everything else goes to math-verify in a persistent worker subprocess
   (`drmas_envs.math._grade_worker`, asked by `_grade_client`). A check may use `timeout_s` seconds of
   the worker's CPU time; a worker that overruns (say, on `9^{9^{9^{9}}}`) is killed, the check is over
   budget, and a fresh worker is started at once. A worker that dies mid-check is restarted and asked
   once more. This bound holds from any thread and any process (math-verify's own signal-based timeout
   refuses non-main threads), and model text is never evaluated as code.

CPU time, not wall time: a grade must not depend on how busy the machine is. Under a wall-clock bound a
check that a loaded (or paused, or SIGSTOPped) machine drew out past the bound graded wrong, so two runs
of the same seed could part on one reward. A check that uses no CPU at all (a blocked worker) still ends
after `wall_timeout_s`. Where the worker's CPU time cannot be read (no /proc), the bound is wall time.

Inputs are capped before any parsing: answers longer than `max_answer_chars` or nested deeper than
`max_depth` braces are over budget.
"""

from __future__ import annotations

import atexit
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from drmas_envs.math._grade_client import WorkerClient, WorkerStartError

DEFAULT_TIMEOUT_S = 5.0
"""The hard bound of one grading check, in seconds of the worker's CPU time."""
__all__ = [
    "DEFAULT_TIMEOUT_S",
    "OUTCOMES",
    "RIGHT",
    "WRONG",
    "Grade",
    "Grader",
    "WorkerStartError",
    "as_number",
    "brace_depth",
    "default_grader",
    "fast_grade",
    "grade",
    "normalise",
    "outcome_of",
]

OUTCOMES = ("right", "wrong", "over_budget", "error")
"""The outcomes of a check, in the order `Grade.outcome` reports them."""

_REMOVE = re.compile(r"\\left|\\right|\\displaystyle|\\[,;:! ]|\\quad|\\qquad|~|\s|\$|\\\$")
_NUMBER = re.compile(r"^[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?$|^[+-]?\.\d+$")
_FRACTION = re.compile(r"^([+-]?)(?:\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}|\\frac(\d)(\d)|([+-]?\d+)/([+-]?\d+))$")


def normalise(text: str) -> str:
    r"""Typography-free form of an answer: no spaces, `$`, `\left`/`\right`, spacing commands; `\frac`."""
    s = _REMOVE.sub("", text)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    while s.startswith("{") and s.endswith("}") and _balanced(s[1:-1]):
        s = s[1:-1]
    return s.rstrip(".")


def _balanced(s: str) -> bool:
    depth = 0
    for c in s:
        depth += (c == "{") - (c == "}")
        if depth < 0:
            return False
    return depth == 0


def as_number(text: str) -> Fraction | None:
    """The exact value of a plain number in normalised form, or None if it is anything else."""
    if len(text) > 64:
        return None
    if _NUMBER.match(text):
        s = text.replace(",", "")
        return Fraction(s + "0" if s.endswith(".") else s)
    m = _FRACTION.match(text)
    if not m:
        return None
    sign, *parts = m.groups()
    num, den = next((a, b) for a, b in zip(parts[::2], parts[1::2]) if a is not None)
    if int(den) == 0:
        return None
    value = Fraction(int(num), int(den))
    return -value if sign == "-" else value


def fast_grade(answer: str, reference: str) -> bool | None:
    """True/False when the fast path can decide, None when math-verify must."""
    a, r = normalise(answer), normalise(reference)
    if a == r:
        return True
    na, nr = as_number(a), as_number(r)
    if na is not None and nr is not None:
        return na == nr
    return None


def brace_depth(text: str) -> int:
    """The deepest `{` nesting in `text`."""
    depth = deepest = 0
    for c in text:
        if c == "{":
            depth += 1
            deepest = max(deepest, depth)
        elif c == "}":
            depth -= 1
    return deepest


@dataclass(frozen=True)
class Grade:
    """The outcome of one check (one of `OUTCOMES`) and, for over_budget and error, why; truthy iff right."""

    outcome: str
    reason: str = ""

    def __bool__(self) -> bool:
        return self.outcome == "right"


RIGHT, WRONG = Grade("right"), Grade("wrong")


def outcome_of(result: object) -> str:
    """The outcome of what a grader returned: a `Grade`'s own, else right or wrong by truth (a plain bool)."""
    outcome = getattr(result, "outcome", None)
    return outcome if outcome in OUTCOMES else ("right" if result else "wrong")


class Grader:
    """Grades answers against references with a hard time bound per check; safe in threads and processes.

    `stats` counts checks by path (`fast`, `worker`, `capped`) and outcome (`over_budget`, `errors`), and
    the worker's `timeouts` (kills at the bound), `retries` (deaths retried) and `deaths` (second deaths).

    Args:
        timeout_s: the most CPU seconds one check may use in the worker; an overrunning worker is
            killed (the check is over budget).
        wall_timeout_s: the most wall seconds one check may take, CPU or not (a blocked worker);
            default max(60, 10 x timeout_s).
        max_answer_chars: longer answers are over budget without parsing.
        max_depth: answers nested deeper than this many braces are over budget without parsing.
        startup_timeout_s: how long to wait for a (re)started worker to import math-verify; not
            counted in `timeout_s`.

    """

    def __init__(
        self,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        *,
        wall_timeout_s: float | None = None,
        max_answer_chars: int = 1000,
        max_depth: int = 40,
        startup_timeout_s: float = 120.0,
    ):
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.timeout_s = float(timeout_s)
        self.wall_timeout_s = float(wall_timeout_s) if wall_timeout_s else max(60.0, 10 * self.timeout_s)
        self.max_answer_chars = max_answer_chars
        self.max_depth = max_depth
        self.startup_timeout_s = startup_timeout_s
        self._client = WorkerClient(self)
        self._counts = {"fast": 0, "worker": 0, "capped": 0, "over_budget": 0, "errors": 0}

    # -- public ---------------------------------------------------------------------------------
    @property
    def stats(self) -> dict[str, int]:
        """Counts of this grader's checks (see the class docstring)."""
        return {**self._counts, **self._client.stats}

    def check(self, answer: str | None, reference: str) -> Grade:
        """The outcome of grading `answer` (an extracted box content, or None) against `reference`."""
        if answer is None or not isinstance(answer, str):
            return WRONG
        if len(answer) > self.max_answer_chars or brace_depth(answer) > self.max_depth:
            self._counts["capped"] += 1
            self._counts["over_budget"] += 1
            return Grade("over_budget", "the answer is longer or nested deeper than the grader reads")
        decided = fast_grade(answer, reference)
        if decided is not None:
            self._counts["fast"] += 1
            return RIGHT if decided else WRONG
        self._counts["worker"] += 1
        return self.ask_worker(answer, reference)

    def grade(self, answer: str | None, reference: str) -> bool:
        """Whether `answer` (an extracted box content, or None) is equivalent to `reference`."""
        return bool(self.check(answer, reference))

    __call__ = grade

    def ask_worker(self, answer: str, reference: str) -> Grade:
        """The outcome by the math-verify worker alone: no length or depth cap, no fast path, no
        `stats["worker"]` count (what `check` calls when the fast path cannot decide).
        """
        outcome, reason = self._client.ask({"answer": answer, "reference": reference})
        if outcome == "over_budget":
            self._counts["over_budget"] += 1
        elif outcome == "error":
            self._counts["errors"] += 1
        return Grade(outcome, reason)

    def check_reference(self, reference: str) -> str:
        """Why math-verify cannot parse `reference` ("" when it can, or when the fast path needs no parse:
        a plain number). Over its time bound is a failure too.
        """
        if as_number(normalise(reference)) is not None:
            return ""
        outcome, reason = self._client.ask({"reference": reference})
        return "" if outcome == "right" else reason or outcome

    def check_references(self, references: Iterable[str], *, keep: int = 50) -> dict:
        """Parse every distinct reference the fast path cannot settle alone; what a run records at start.

        Returns:
            {"checked": how many were parsed, "failed": how many failed, "failures": the first `keep`
            as {"reference", "reason"}}.

        """
        distinct = dict.fromkeys(str(r) for r in references)
        todo = [r for r in distinct if as_number(normalise(r)) is None]
        failures = [{"reference": r, "reason": why} for r in todo if (why := self.check_reference(r))]
        return {"checked": len(todo), "failed": len(failures), "failures": failures[:keep]}

    @property
    def worker_pid(self) -> int | None:
        """The math-verify worker's process id (None until a check first needs it, or after `close`)."""
        return self._client.worker_pid

    def close(self) -> None:
        """Stop the worker (a later `grade` starts a new one)."""
        self._client.close()


_SHARED: dict[tuple[float, int], Grader] = {}
_SHARED_LOCK = threading.Lock()


def default_grader(timeout_s: float = DEFAULT_TIMEOUT_S, max_answer_chars: int = 1000) -> Grader:
    """The process-wide shared `Grader` with this time bound and answer cap (created on first use, stopped
    at exit).

    Envs share it, so the hundreds of envs of an evaluation use one worker process, not hundreds.
    """
    key = (float(timeout_s), int(max_answer_chars))
    with _SHARED_LOCK:
        grader = _SHARED.get(key)
        if grader is None:
            grader = _SHARED[key] = Grader(timeout_s, max_answer_chars=max_answer_chars)
            atexit.register(grader.close)
        return grader


def grade(answer: str | None, reference: str) -> bool:
    """Grade with the shared default `Grader`."""
    return default_grader().grade(answer, reference)
