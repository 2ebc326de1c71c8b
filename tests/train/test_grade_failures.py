"""Grading failures in real smoke runs (the tiny model, the real math-verify worker): a reference answer
math-verify cannot parse is recorded at start, counted in `grade/errors`, warned about by name, and above
`max_grade_error_share` it ends the run with one line, a non-zero exit and the last checkpoint intact; the
policy's over-budget answers are counted in `grade/over_budget` and never end a run."""

import json
import logging
import os
import subprocess
import sys

import pytest
import yaml

from drmas_train.cli.main import _progress_line
from drmas_train.config import build_config
from drmas_train.run.checkpoint import latest_checkpoint, load_checkpoint
from drmas_train.run.trainer import Trainer

BROKEN = "\\frac{3}{"  # math-verify finds no expression in it; a policy's "3" reaches the worker
ROOT = "\\sqrt{9}"  # parses; not a plain number, so a policy's "3" reaches the worker
NO_EVAL = {"eval.every": 0, "eval.before_train": False}


def _data(path, answer):
    """Sums the tiny model was fitted on (it answers them with numbers), each with `answer` as its reference."""
    sums = enumerate([(1, 2), (2, 1)])
    rows = [{"problem": f"What is {a} + {b}?", "answer": answer, "id": f"p{i}"} for i, (a, b) in sums]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _rows(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_an_unparsable_reference_is_recorded_counted_warned_and_stops_the_run(tmp_path, caplog):
    run = tmp_path / "run"
    overrides = {
        "log.run_dir": str(run),
        "env.kwargs": {"dataset": _data(tmp_path / "broken.jsonl", BROKEN)},
        "steps": 1,
        "max_grade_error_share": 1.0,  # this first step may not stop: it leaves a checkpoint
        "log.checkpoint_every": 1,
        **NO_EVAL,
    }
    with caplog.at_level(logging.WARNING):
        [row] = Trainer(build_config("smoke", overrides)).train()
    # recorded at start, in the run's provenance
    record = yaml.safe_load((run / "config.yaml").read_text())["data_provenance"]["train"]["reference_check"]
    assert record["checked"] == 1 and record["failed"] == 1
    assert record["failures"] == [{"reference": BROKEN, "reason": "math-verify finds no expression in the reference"}]
    # counted: every check against it is an error, none passes as a wrong answer
    assert row["grade/checks"] > 0 and row["grade/errors"] == row["grade/checks"] and row["grade/over_budget"] == 0
    assert _rows(run)[-1]["grade/errors"] == row["grade/errors"]
    # warned about by name: at start and in the step
    named = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and BROKEN in r.getMessage()]
    assert any(m.startswith("train data: the grader cannot parse 1 of the 1") for m in named), named
    assert any(m.startswith("step 1: ") and "grade/errors" in m for m in named), named

    # the next step, over the share: one line, exit status 5, the checkpoint of step 1 intact
    argv = [sys.executable, "-m", "drmas_train", "--run-dir", str(run), "--resume", "--steps", "3"]
    argv += ["--set", "max_grade_error_share=0.1"]
    env = {**os.environ, "COLUMNS": "80"}  # a narrow terminal: the error must still be one line
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, timeout=600)
    assert proc.returncode == 5, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: grading failed in step 2: ") and "max_grade_error_share 0.1" in last, last
    assert repr(BROKEN) in last and "the last complete checkpoint is step 1" in last, last
    ckpt = load_checkpoint(latest_checkpoint(run / "checkpoints"))
    assert ckpt["state"]["step"] == 1 and ckpt["weights"] and ckpt["learners"]
    assert max(r["step"] for r in _rows(run)) == 1  # the stopped step trained nothing and logged no row


@pytest.mark.slow
def test_over_budget_answers_are_counted_and_never_stop_the_run(tmp_path):
    run = tmp_path / "run"
    overrides = {
        "log.run_dir": str(run),
        # a parsable reference the fast path cannot settle; no answer is short enough for the grader
        "env.kwargs": {"dataset": _data(tmp_path / "roots.jsonl", ROOT), "grade_max_answer_chars": 0},
        "steps": 2,
        "max_grade_error_share": 0.0,  # any error would stop it
        **NO_EVAL,
    }
    rows = Trainer(build_config("smoke", overrides)).train()
    assert [r["step"] for r in rows] == [1, 2]
    logged = _rows(run)
    assert [r["step"] for r in logged] == [1, 2]
    for row in logged:  # every step, every check over budget, none an error
        assert row["grade/over_budget"] == row["grade/checks"] and row["grade/errors"] == 0
    assert sum(r["grade/checks"] for r in logged) > 0


@pytest.mark.slow
def test_a_math_verify_that_fails_its_self_check_ends_the_run_at_start(tmp_path):
    """A math-verify that cannot grade (a stand-in package ahead of the real one on the path, as a broken
    upgrade would be) is found by the reference check at start: one line, status 5, before any step."""
    broken = tmp_path / "stand_in" / "math_verify"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text(
        "def parse(text, **kw):\n    return []\n\ndef verify(a, b, **kw):\n    return False\n"
    )
    run = tmp_path / "run"
    argv = [sys.executable, "-m", "drmas_train", "--preset", "smoke", "--run-dir", str(run)]
    argv += ["--set", f"env.kwargs.dataset={_data(tmp_path / 'roots.jsonl', ROOT)}"]
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(tmp_path / "stand_in")}
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, timeout=600)
    assert proc.returncode == 5, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr and last.startswith(
        "error: the math-verify grading worker failed its self-check"
    )
    assert not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text()


def test_the_progress_line_shows_grade_errors_and_over_budget():
    row = {"reward/team": 0.5, "accuracy": 0.5, "grad_norm/shared": 1.0, "time/step": 2.0}
    assert "grade err" not in _progress_line(row, [])  # an env that does not count its grades
    row.update({"grade/checks": 9, "grade/errors": 2, "grade/over_budget": 3})
    assert "| grade err 2 over budget 3 |" in _progress_line(row, [])
