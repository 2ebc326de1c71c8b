"""The math-verify worker process: reads JSON-line requests on stdin, answers on stdout.

Run by `drmas_envs.math.grading.Grader` as `python -m drmas_envs.math._grade_worker`. Each check may
use `cpu_s` seconds of this process's CPU time (a SIGPROF timer, which counts CPU time, not wall
time: a check is not cut short because the machine is busy or the process was stopped); one that
overruns grades over budget. math-verify's own wall-clock (SIGALRM) timeouts are off for that reason.
The parent still enforces a hard bound by killing this process (a long C call cannot take the signal).
It never evaluates text as code: math-verify parses LaTeX into sympy expressions.

Protocol: a line {"answer": str, "reference": str, "cpu_s": float} -> a line {"outcome": str, "error": str},
the outcome one of right, wrong, over_budget, error (`error` says why for the last two); a request
without "answer" only parses the reference (outcome right when it parses). A reference that math-verify
cannot parse (an exception, or no expression) is an error unless the answer matches it anyway; an answer
that cannot be parsed is wrong (the answer's fault); a comparison that raises, with no other comparison
saying equal, is an error. First line out: {"ready": true}, or {"ready": false, "error": str} when a
known pair does not grade as it must (math-verify broken or incompatible), so the parent fails loudly
instead of grading every answer wrong.
"""

from __future__ import annotations

import functools
import json
import logging
import signal
import sys

_REPEAT_S = 0.05
"""After the budget, the timer fires again every this many CPU seconds until the check ends."""


_NO_WALL_TIMEOUT = 0
"""math-verify's timeout argument meaning none: >= 0.8 skips the alarm for values <= 0 (and takes None,
which 0.7 rejects); 0.7 calls signal.alarm(0), which sets no alarm."""

SELF_CHECK = (
    ("0.5", "\\frac{1}{2}", "right"),
    ("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", "right"),
    ("x^2+2x+1", "(x+1)^2", "right"),
    ("\\left(3, \\frac{\\pi}{2}\\right)", "(3, \\pi/2)", "right"),
    ("\\sqrt{3}", "3", "wrong"),
    ("\\sqrt{3}", "\\frac{", "error"),
)
"""(answer, reference, outcome) pairs the worker grades before it says ready: equal forms, a near miss,
and a reference it cannot parse."""


class OverBudget(BaseException):
    """A check used its CPU budget. A BaseException, so that math-verify's own handlers do not swallow it."""


def _over_budget(signum, frame):
    raise OverBudget("the check used its CPU budget")


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


class Checker:
    """Grades with math-verify: reference parses cached, failures told apart from wrong answers."""

    def __init__(self):
        from math_verify import parse, verify
        from sympy import Basic
        from sympy.matrices import MatrixBase

        self.verify = verify
        self.expression_types = (Basic, MatrixBase)

        @functools.lru_cache(maxsize=4096)
        def parse_boxed(text: str, raise_on_error: bool = False):
            return parse(f"\\boxed{{{text}}}", parsing_timeout=_NO_WALL_TIMEOUT, raise_on_error=raise_on_error)

        self.parse_boxed = parse_boxed

    def reference(self, text: str) -> tuple[list, str]:
        """The parse of a reference and, when math-verify finds no expression in it, why ("" when it does)."""
        try:
            gold = self.parse_boxed(text, True)
        except Exception as exc:
            return [], f"math-verify cannot parse the reference ({_why(exc)})"
        if not any(isinstance(g, self.expression_types) for g in gold):
            return gold, "math-verify finds no expression in the reference"
        return gold, ""

    def grade(self, answer: str | None, reference: str) -> tuple[str, str]:
        """(outcome, why) of one check (no time bound here: the caller sets the timer)."""
        gold, bad_reference = self.reference(reference)
        if answer is None:
            return ("error", bad_reference) if bad_reference else ("right", "")
        pred = self.parse_boxed(answer)  # an answer math-verify cannot parse is wrong, not an error
        failure = ""
        for g in gold:
            for p in pred:
                try:
                    if self.verify(g, p, timeout_seconds=_NO_WALL_TIMEOUT, raise_on_error=True):
                        return "right", ""
                except Exception as exc:
                    failure = failure or f"math-verify could not compare ({_why(exc)})"
        if bad_reference or failure:
            return "error", bad_reference or failure
        return "wrong", ""


def main() -> None:
    # math-verify logs every disabled timeout; its failures come back in each reply instead
    logging.disable(logging.CRITICAL)
    out = sys.stdout
    # warm up (lazy imports, the LaTeX parser) before saying ready, so the first real check is not
    # slowed past its time bound by one-time setup
    try:
        checker = Checker()
        error = ""
        for answer, reference, expected in SELF_CHECK:
            outcome, why = checker.grade(answer, reference)
            if outcome != expected:
                error = f"math-verify graded {answer} against {reference} as {outcome}, not {expected} {why}".strip()
                break
    except Exception as exc:
        error = _why(exc)
    out.write(json.dumps({"ready": not error, "error": error}) + "\n")
    out.flush()
    if error:
        return
    signal.signal(signal.SIGPROF, _over_budget)
    for line in sys.stdin:
        try:
            req = json.loads(line)
            signal.setitimer(signal.ITIMER_PROF, float(req.get("cpu_s", 2.5)), _REPEAT_S)
            try:
                outcome, why = checker.grade(req.get("answer"), req["reference"])
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
            reply = {"outcome": outcome, "error": why}
        except OverBudget as exc:
            reply = {"outcome": "over_budget", "error": _why(exc)}
        except Exception as exc:  # a failure of this worker: an error, never a crash
            reply = {"outcome": "error", "error": f"grading worker: {_why(exc)}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
