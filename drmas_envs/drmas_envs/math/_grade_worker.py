"""The math-verify worker process: reads JSON-line requests on stdin, answers on stdout.

Run by `drmas_envs.math.grading.Grader` as `python -m drmas_envs.math._grade_worker`. Each check may
use `cpu_s` seconds of this process's CPU time (a SIGPROF timer, which counts CPU time, not wall
time: a check is not cut short because the machine is busy or the process was stopped); one that
overruns grades wrong. math-verify's own wall-clock (SIGALRM) timeouts are off for that reason. The
parent still enforces a hard bound by killing this process (a long C call cannot take the signal).
It never evaluates text as code: math-verify parses LaTeX into sympy expressions.

Protocol: a line {"answer": str, "reference": str, "cpu_s": float} -> a line {"ok": bool, "error": str}.
First line out: {"ready": true}, or {"ready": false, "error": str} when a known-equal pair does not grade
equal (math-verify broken or incompatible), so the parent fails loudly instead of grading every answer wrong.
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


class OverBudget(BaseException):
    """A check used its CPU budget. A BaseException, so that math-verify's own handlers do not swallow it."""


def _over_budget(signum, frame):
    raise OverBudget("the check used its CPU budget")


def main() -> None:
    logging.disable(logging.CRITICAL)  # math-verify logs every timeout; nobody reads our stderr
    from math_verify import parse, verify

    @functools.lru_cache(maxsize=4096)
    def parse_boxed(text: str):
        return parse(f"\\boxed{{{text}}}", parsing_timeout=_NO_WALL_TIMEOUT)

    # warm up (lazy imports, the LaTeX parser) before saying ready, so the first real check is not
    # slowed past its time bound by one-time setup
    out = sys.stdout
    try:
        works = bool(verify(parse_boxed("\\frac{1}{2}"), parse_boxed("0.5"), timeout_seconds=_NO_WALL_TIMEOUT))
        error = "" if works else "math-verify graded 1/2 against 0.5 as different"
    except Exception as exc:
        works, error = False, f"{type(exc).__name__}: {str(exc)[:200]}"
    out.write(json.dumps({"ready": works, "error": error}) + "\n")
    out.flush()
    if not works:
        return
    signal.signal(signal.SIGPROF, _over_budget)
    for line in sys.stdin:
        try:
            req = json.loads(line)
            signal.setitimer(signal.ITIMER_PROF, float(req.get("cpu_s", 2.5)), _REPEAT_S)
            try:
                gold = parse_boxed(req["reference"])
                pred = parse_boxed(req["answer"])
                ok = bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=_NO_WALL_TIMEOUT))
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
            reply = {"ok": ok, "error": ""}
        except (Exception, OverBudget) as exc:  # a grading failure is a wrong answer, never a crash
            reply = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
