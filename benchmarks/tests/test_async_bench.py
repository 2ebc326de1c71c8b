"""drmas_benchmarks.async_bench: the pipeline model by hand, and one measured run of the smoke preset."""

import pytest

from drmas_benchmarks import async_bench as bench


def test_the_pipeline_model_by_hand():
    p = bench.Phases(generate=6.0, score=1.0, update=3.0, push=0.5)
    assert bench.sync_step_s(p) == 10.5
    # The rollout hides the score and the update: the step is the rollout plus the push.
    assert bench.pipelined_step_s(rollout=6.0, update=3.0, score=1.0, push=0.5) == 6.5
    # A learner-bound step: the rollout is hidden instead.
    assert bench.pipelined_step_s(rollout=2.0, update=8.0, score=1.0, push=0.0) == 9.0
    assert bench.cpu_bounds(p) == (6.5, 10.5)


def test_one_run_measures_steps_and_staleness(tmp_path):
    run = bench.one_run("smoke", 1, 3, None)
    assert run["k"] == 1 and len(run["walls"]) == 3 and all(w > 0 for w in run["walls"])
    assert [r["rollout/staleness_mean"] for r in run["rows"]] == [0.0, 1.0, 1.0]
    phases = bench.phases_of([{**bench.one_run("smoke", 0, 2, None)}])
    assert phases.generate > 0 and phases.update > 0 and phases.push >= 0
    summary = bench.summary({"runs": [run, {**run, "k": 0}]})
    w = run["walls"]
    assert summary["run_speedup"][1] == pytest.approx(1.0)  # the same walls, whole runs
    assert summary["speedup"][1] == pytest.approx((w[1] + w[2]) / 2 / w[1])  # k = 1 drops its last step


def test_steady_steps_leave_out_the_fill_and_the_drain():
    assert bench.steady_walls({"k": 0, "walls": [9.0, 4.0, 5.0]}) == [4.0, 5.0]
    # k = 2: the last two steps update with no rollout beside them, so they are not steady
    assert bench.steady_walls({"k": 2, "walls": [9.0, 4.0, 5.0, 2.0, 2.0]}) == [4.0, 5.0]
    assert bench.steady_walls({"k": 2, "walls": [9.0, 2.0, 2.0]}) == []
