"""Answer extraction and grading: equivalent forms, wrong answers, hostile inputs within the time bound."""

import concurrent.futures as cf
import multiprocessing as mp
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from drmas_envs.math import _grade_client
from drmas_envs.math.answers import clip_middle, extract_answer, extract_verdict, last_boxed
from drmas_envs.math.datasets import load_jsonl_tasks
from drmas_envs.math.grading import Grader, default_grader, fast_grade, normalise

DATA = Path(os.environ.get("DRMAS_DATA_DIR") or Path(__file__).parents[2].parent / "shared" / "data") / "math"
BOUND = 1.0  # the grader's hard bound in these tests, seconds
# worker restarts and scheduling on a loaded 2-core machine; without the bound these checks run for minutes
SLACK = 60.0


@pytest.fixture(scope="module")
def grader():
    g = Grader(timeout_s=BOUND)
    yield g
    g.close()


@pytest.fixture(scope="module")
def patient_grader():
    """For correctness checks: a bound loose enough that a loaded machine never turns a slow check into 'wrong'."""
    g = Grader(timeout_s=30.0)
    yield g
    g.close()


@pytest.mark.parametrize(
    ("text", "box"),
    [
        ("so \\boxed{5}.", "5"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("\\boxed{{a}{b{c}}}", "{a}{b{c}}"),
        ("\\fbox{7}", "7"),
        ("\\boxed 7 is it", "7"),
        ("\\boxed{3} and a truncated \\boxed{4", "3"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
        ("The> \\boxedboxed{}", None),
        ("\\boxed{2} then \\boxedx{9}", "2"),
        ("no box at all", None),
        ("", None),
    ],
)
def test_last_boxed(text, box):
    assert last_boxed(text) == box


@pytest.mark.parametrize("content", ["", " ", "\\ldots", "\\text{}", "answer", "?", "$ $", "\\quad", "-", "\\dots"])
def test_non_answers_are_malformed(content):
    answer, why = extract_answer(f"\\boxed{{{content}}}")
    assert answer is None and why


@pytest.mark.parametrize("content", ["0", "\\pi", "x^2", "\\text{(C)}", "\\emptyset", "-\\frac{1}{2}", "é"])
def test_answers_are_well_formed(content):
    assert extract_answer(f"x \\boxed{{{content}}}")[0] == content


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("ok <verify>approve</verify>", "approve"),
        ("<VERIFY> Reject. </VERIFY>", "reject"),
        ("<verify>reject</verify> on reflection <verify>reject</verify>", "reject"),
        ("<verify>approve</verify><verify>reject</verify>", None),
        ("<verify>yes</verify>", None),
        ("approve", None),
        ("<verify>" * 20000, None),
    ],
)
def test_verdicts(text, verdict):
    assert extract_verdict(text)[0] == verdict


def test_clip_middle_keeps_head_and_tail():
    text = "HEAD" + "x" * 10_000 + "\\boxed{9}"
    clipped = clip_middle(text, 100)
    assert clipped.startswith("HEAD") and clipped.endswith("\\boxed{9}") and len(clipped) < 200
    assert clip_middle("short", 100) == "short"


EQUIVALENT = [
    ("1/2", "\\frac{1}{2}"),
    ("\\dfrac{1}{2}", "\\frac{1}{2}"),
    ("0.5", "\\frac{1}{2}"),
    ("\\frac12", "0.5"),
    ("$\\frac{1}{2}$", "1/2"),
    (" \\frac { 1 } { 2 } ", "\\tfrac{1}{2}"),
    ("1,000", "1000"),
    ("18.00", "18"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("2\\sqrt{3}", "\\sqrt{12}"),
    ("x^2+2x+1", "(x+1)^2"),
    ("90^\\circ", "90"),
    ("\\$18", "18"),
]
DIFFERENT = [
    ("1/3", "\\frac{1}{2}"),
    ("0.49", "0.5"),
    ("19", "18"),
    ("\\sqrt{3}", "\\sqrt{2}"),
    ("(3,\\pi)", "(3,\\pi/2)"),
]


@pytest.mark.parametrize(("answer", "reference"), EQUIVALENT)
def test_equivalent_forms_agree(patient_grader, answer, reference):
    assert patient_grader(answer, reference) is True


@pytest.mark.parametrize(("answer", "reference"), DIFFERENT)
def test_different_answers_disagree(grader, answer, reference):
    assert grader(answer, reference) is False


def test_fast_path_decides_plain_numbers_without_the_worker():
    assert fast_grade("0.5", "1/2") is True and fast_grade("7", "8") is False
    assert fast_grade("\\sqrt{4}", "2") is None  # needs math-verify
    assert normalise("$\\left( 1 \\right)$.") == "(1)"


HOSTILE = ["9^{9^{9^{9}}}", "{" * 5000 + "1" + "}" * 5000, "x" * 1_000_000, "9!!!!!!!!!!!!!!!!"]


@pytest.mark.parametrize("answer", HOSTILE, ids=["tower", "deep", "1MB", "factorials"])
def test_hostile_inputs_return_within_the_bound(grader, answer):
    assert grader("\\sqrt{4}", "2") is True  # a started worker: time the check, not a worker start
    t0 = time.monotonic()
    assert grader(answer, "1") is False
    assert time.monotonic() - t0 < BOUND + SLACK
    assert grader("\\sqrt{4}", "2") is True  # the worker is healthy (or restarted) afterwards


def test_hostile_solver_output_end_to_end(grader):
    assert grader("\\sqrt{4}", "2") is True
    t0 = time.monotonic()
    answer, _ = extract_answer("\\boxed{" * 100_000 + "x" * 1_000_000 + "\\boxed{9^{9^{9^{9}}}}")
    assert answer == "9^{9^{9^{9}}}" and grader(answer, "3") is False
    assert time.monotonic() - t0 < BOUND + SLACK


def test_bound_holds_in_threads(grader):
    assert grader("\\sqrt{4}", "2") is True
    with cf.ThreadPoolExecutor(4) as pool:
        t0 = time.monotonic()
        futures = [
            pool.submit(grader, a, r) for a, r in [("9^{9^{9^{9}}}", "1"), ("\\sqrt{9}", "3"), ("2^{10}", "1024")]
        ]
        results = [f.result() for f in futures]
    assert time.monotonic() - t0 < 3 * BOUND + SLACK  # calls are serialised by the grader's lock
    assert results[0] is False and grader.stats["timeouts"] + grader.stats["over_budget"] >= 1
    # the restarted worker still grades; a loose bound here so that a loaded machine can't flip it
    grader.timeout_s = 30.0
    try:
        assert grader("\\sqrt{9}", "3") is True and grader("2^{10}", "1024") is True
    finally:
        grader.timeout_s = BOUND


def _in_child(queue):
    g = default_grader(BOUND)
    g("\\sqrt{4}", "2")  # the child starts its own worker
    t0 = time.monotonic()
    tower = g("9^{9^{9^{9}}}", "1")
    seconds = time.monotonic() - t0
    g.timeout_s = 30.0  # the restarted worker still grades (a loose bound: a loaded machine can't flip it)
    queue.put((tower, g("\\sqrt{16}", "4"), seconds))


def test_bound_holds_in_a_forked_process(grader):
    assert grader("\\sqrt{4}", "2")  # the parent's worker exists before the fork
    default_grader(BOUND)("\\sqrt{4}", "2")
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_in_child, args=(queue,))
    proc.start()
    tower, sqrt, seconds = queue.get(timeout=60)
    proc.join(30)
    assert (tower, sqrt) == (False, True) and seconds < BOUND + SLACK
    assert default_grader(BOUND)("\\sqrt{4}", "2")  # the parent's worker is untouched


@pytest.mark.skipif(not DATA.is_dir(), reason="shared math data not present")
def test_real_data_sample(grader):
    """A sample of the full sweep (benchmarks/drmas_benchmarks/grade_real_data.py): about 6 items per file."""
    failures = []
    for path in sorted(DATA.glob("*.jsonl")):
        tasks = load_jsonl_tasks(path)
        for i in range(0, len(tasks), max(1, len(tasks) // 6)):
            ref = tasks[i]["answer"]
            answer, _ = extract_answer(f"Thus $\\boxed{{{ref}}}$.")
            if not grader(answer, ref):
                failures.append((path.name, ref))
            other = next(t["answer"] for t in tasks[i + 1 :] + tasks[:i] if normalise(t["answer"]) != normalise(ref))
            if grader(other, ref) and not other.startswith(("x=", "y=")):
                failures.append((path.name, other, ref))
    assert not failures


def _stopped(pid: int, seconds: float | None) -> None:
    """SIGSTOP `pid` now and, unless `seconds` is None, SIGCONT it that many seconds later."""
    os.kill(pid, signal.SIGSTOP)
    if seconds is not None:
        threading.Timer(seconds, os.kill, (pid, signal.SIGCONT)).start()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the worker's CPU time is read from /proc (Linux)")
def test_a_check_drawn_out_by_a_paused_worker_still_grades_right():
    """The bound counts the worker's CPU time: a check the machine delays (here: the worker stopped for
    three times the bound) grades as it would on an idle machine."""
    g = Grader(timeout_s=BOUND)
    try:
        assert g("\\sqrt{4}", "2") is True  # the worker is up
        _stopped(g.worker_pid, 3 * BOUND)
        t0 = time.monotonic()
        assert g("\\sqrt{9}", "3") is True
        assert time.monotonic() - t0 >= 3 * BOUND * 0.9 and g.stats["timeouts"] == 0
    finally:
        g.close()


def test_a_worker_that_never_answers_is_killed_at_the_wall_bound():
    g = Grader(timeout_s=BOUND, wall_timeout_s=2.0)
    try:
        assert g("\\sqrt{4}", "2") is True
        stuck = g.worker_pid
        _stopped(stuck, None)  # uses no CPU, never answers
        t0 = time.monotonic()
        assert g("\\sqrt{9}", "3") is False
        assert time.monotonic() - t0 < 2.0 + SLACK and g.stats["timeouts"] == 1
        assert g.worker_pid != stuck
        g.timeout_s = 30.0  # the fresh worker grades (a loose bound: a loaded machine can't flip it)
        assert g("\\sqrt{9}", "3") is True
    finally:
        g.close()


def test_a_math_verify_that_cannot_grade_fails_loudly(tmp_path, monkeypatch):
    """A math-verify that grades a known-equal pair as different (here a stand-in package named
    math_verify, ahead of the real one on the worker's path: the real failure was an older release
    rejecting an argument, which it logs and answers with "different") stops grading with the reason,
    instead of grading every answer wrong."""
    broken = tmp_path / "math_verify"
    broken.mkdir()
    (broken / "__init__.py").write_text(
        "def parse(text, **kw):\n    return []\n\ndef verify(a, b, **kw):\n    return False\n"
    )
    # first on the worker's path, ahead of the folder drmas_envs is imported from (site-packages, installed)
    monkeypatch.setattr(_grade_client, "PACKAGE_ROOT", os.pathsep.join([str(tmp_path), _grade_client.PACKAGE_ROOT]))
    g = Grader(timeout_s=30.0)
    try:
        with pytest.raises(RuntimeError, match="self-check.*0.5 against .*frac.*1.*2"):
            g("\\sqrt{4}", "2")
        assert g.worker_pid is None
    finally:
        g.close()
