"""The math-verify worker process: reads JSON-line requests on stdin, answers on stdout.

Run by `drmas_envs.math.grading.Grader` as `python -m drmas_envs.math._grade_worker`. It runs
math-verify in its own main thread, so math-verify's signal-based timeouts work; the parent still
enforces a hard bound by killing this process. It never evaluates text as code: math-verify parses
LaTeX into sympy expressions.

Protocol: a line {"answer": str, "reference": str, "timeout": int} -> a line {"ok": bool, "error": str}.
First line out: {"ready": true}.
"""

from __future__ import annotations

import functools
import json
import logging
import sys


def main() -> None:
    logging.disable(logging.CRITICAL)  # math-verify logs every timeout; nobody reads our stderr
    from math_verify import parse, verify

    @functools.lru_cache(maxsize=4096)
    def parse_boxed(text: str, timeout: int):
        return parse(f"\\boxed{{{text}}}", parsing_timeout=timeout)

    # warm up (lazy imports, the LaTeX parser) before saying ready, so the first real check is not
    # slowed past its time bound by one-time setup
    verify(parse_boxed("\\frac{1}{2}", 5), parse_boxed("0.5", 5), timeout_seconds=5)
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            timeout = int(req.get("timeout", 3))
            gold = parse_boxed(req["reference"], timeout)
            pred = parse_boxed(req["answer"], timeout)
            ok = bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=timeout))
            reply = {"ok": ok, "error": ""}
        except Exception as exc:  # a grading failure is a wrong answer, never a crash
            reply = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
