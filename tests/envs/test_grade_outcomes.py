"""Every grade is right, wrong, over budget or error, with the real math-verify in real worker processes:
a reference math-verify cannot parse is an error (an answer it cannot parse is wrong), a worker killed
mid-check is asked again once, a second death is an error, and a math env counts its grades in its infos."""

import json
import os
import signal
import threading
import time

import pytest

import drmas_envs
from drmas_envs.math.grading import Grader

BROKEN = "\\frac{1}{"  # a reference math-verify finds no expression in
HARD_PAIR = ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}")  # misses the fast path: the worker decides


@pytest.fixture(scope="module")
def grader():
    g = Grader(timeout_s=30.0)  # loose: a loaded machine never turns a slow check into over budget
    yield g
    g.close()


def test_each_check_has_one_of_four_outcomes(grader):
    assert grader.check(*HARD_PAIR).outcome == "right" and grader.check(*HARD_PAIR)
    assert grader.check("\\sqrt{3}", "\\sqrt{2}").outcome == "wrong"
    # the policy's unparsable answer is its own fault: wrong, not an error
    assert grader.check("}{\\", "\\sqrt{2}").outcome == "wrong"
    bad = grader.check("3", BROKEN)
    assert bad.outcome == "error" and "reference" in bad.reason and not bad
    assert grader.check("x" * 2000, "\\sqrt{2}").outcome == "over_budget"
    errors = grader.stats["errors"]
    assert grader.check("5", "\\frac{1}{0}").outcome == "error"  # math-verify's comparison raises
    assert grader.stats["errors"] == errors + 1


def test_check_references_names_those_that_fail(grader):
    report = grader.check_references(["7", "7", "\\frac{1}{2}", "\\sqrt{2}", BROKEN, BROKEN, "\\left("])
    assert report["checked"] == 3  # distinct, and plain numbers need no parse
    assert report["failed"] == 2
    assert [f["reference"] for f in report["failures"]] == [BROKEN, "\\left("]


def _in_flight(g: Grader, pair: tuple[str, str]) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(g.check(*pair)))
    thread.start()
    return thread, out


def test_a_worker_killed_mid_check_is_asked_again_once():
    g = Grader(timeout_s=30.0)
    try:
        assert g.check(*HARD_PAIR).outcome == "right"  # the worker is up
        first = g.worker_pid
        os.kill(first, signal.SIGSTOP)  # it takes the request but cannot answer
        thread, out = _in_flight(g, HARD_PAIR)
        time.sleep(0.5)
        os.kill(first, signal.SIGKILL)  # dies mid-check
        thread.join(120)
        assert out and out[0].outcome == "right"  # the retry graded it
        assert g.stats["retries"] == 1 and g.stats["deaths"] == 0 and g.worker_pid != first
    finally:
        g.close()


def test_a_worker_that_dies_twice_in_one_check_is_an_error():
    g = Grader(timeout_s=30.0)
    try:
        assert g.check(*HARD_PAIR).outcome == "right"
        first = g.worker_pid
        os.kill(first, signal.SIGSTOP)
        thread, out = _in_flight(g, HARD_PAIR)
        time.sleep(0.5)
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while g.worker_pid in (first, None) and time.monotonic() < deadline:  # the retry's fresh worker
            time.sleep(0.001)
        second = g.worker_pid
        os.kill(second, signal.SIGSTOP)  # still importing math-verify: it cannot have answered
        time.sleep(0.3)
        os.kill(second, signal.SIGKILL)
        thread.join(120)
        assert out and out[0].outcome == "error" and "died twice" in out[0].reason
        assert g.stats["retries"] == 1 and g.stats["deaths"] == 1 and g.stats["errors"] == 1
        assert g.check(*HARD_PAIR).outcome == "right"  # and the grader works after
    finally:
        g.close()


def test_a_math_env_counts_its_grades_and_names_the_failing_reference(tmp_path):
    data = tmp_path / "broken.jsonl"
    rows = [{"problem": "What is 1 + 2?", "answer": BROKEN, "id": "p0"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = drmas_envs.make("math-1agent", dataset=str(data))
    assert drmas_envs.reference_check(env)["failures"] == [
        {"reference": BROKEN, "reason": "math-verify finds no expression in the reference"}
    ]
    env.reset(seed=0)
    env.step("1 + 2 = 3, so \\boxed{3}. Check: 3 - 2 = 1")
    info = env.infos["solver"]
    assert info["correct"] is False
    # the boxed answer and the loose last number (1), both against the broken reference
    assert info["grades"] == {"right": 0, "wrong": 0, "over_budget": 0, "error": 2}
    assert [e["reference"] for e in info["grade_errors"]] == [BROKEN]
