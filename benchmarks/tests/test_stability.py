"""Stability analysis: spikes, grad-norm summaries, and E[A^2 | agent] against its prediction."""

import json
import math

import numpy as np
import pytest

from drmas_benchmarks.stability.analysis import (
    calls_from_trajectories,
    grad_norm_summary,
    predicted_pooled_sq_mean,
    read_jsonl,
    running_median_spikes,
    second_moments,
    synthetic_calls,
)

NAN = float("nan")


def test_spikes_against_the_running_median_by_hand():
    # i=3: 10 > 5 x median(1,1,1) = 5 -> spike. i=6: 6 > 5 x median(1,1,1,10,1,1) = 5 -> spike.
    # i=7 (nan) is a skipped step; i=8: 1 is not. The first three steps have too little history.
    norms = [1, 1, 1, 10, 1, 1, 6, NAN, 1, 0]
    assert running_median_spikes(norms) == [3, 6]
    # zero-signal steps (norm 0) do not drag the running median to 0
    assert running_median_spikes([0, 0, 0, 1, 1, 1, 2, 0, 0, 0, 0]) == []
    assert running_median_spikes([100, 1, 1, 1]) == []  # a large first step has no history to be judged on
    # window 2: at i=4 the last two finite norms are 10 and 1, median 5.5 -> 20 is not above 27.5
    assert running_median_spikes([1, 1, 1, 10, 1, 20], window=2) == [3]
    s = grad_norm_summary(norms)
    # finite, non-zero: 1 1 1 10 1 1 6 1 -> median 1, max 10; sorted, the 90th percentile sits 0.3 of
    # the way from the 7th (6) to the 8th (10) value: 7.2
    assert s.pop("p90") == pytest.approx(7.2)
    expected = {"steps": 10.0, "median": 1.0, "max": 10.0, "max_over_median": 10.0, "spikes": 2.0}
    assert s == {**expected, "skipped": 1.0, "zero": 1.0}
    assert math.isnan(grad_norm_summary([NAN])["median"]) and grad_norm_summary([NAN])["skipped"] == 1


def test_prediction_by_hand_on_one_group():
    # One group: agent s rewards 0 2 1 1 2 0 (mean 1, population var 2/3), agent v 1 4 7 (mean 4, var 6);
    # all nine: mean 2, unbiased var 40/8 = 5. v: (6 + (4-2)^2) / 5 = 2.0, gap 4/5; s: (2/3 + 1) / 5 = 1/3.
    r = [0, 2, 1, 1, 1, 4, 2, 0, 7]
    a = ["s", "s", "v"] * 3
    p = predicted_pooled_sq_mean(r, group_ids=[0] * 9, agent_ids=a)
    assert p["v"]["predicted"] == pytest.approx(2.0) and p["v"]["gap"] == pytest.approx(0.8)
    assert p["s"]["predicted"] == pytest.approx(1 / 3) and p["s"]["gap"] == pytest.approx(0.2)


def test_global_normalisation_inflates_the_minority_agent_and_drmas_does_not():
    # The solver is called once per episode and often malformed, the verifier four times and never:
    # in groups where the team reward is constant, all the variance is the solver's.
    d = synthetic_calls({"solver": (1, 0.5), "verifier": (4, 0.0)}, n_groups=128, group_size=8, seed=3)
    assert set(np.unique(d["rewards"]).round(6)) <= {-0.1, 0.0, 0.9, 1.0}
    assert len(d["rewards"]) == 128 * 8 * 5
    m = second_moments(**d)
    for agent in ("solver", "verifier"):
        assert m[agent]["sq_pooled"] == pytest.approx(m[agent]["predicted_pooled"], rel=1e-3)
        assert m[agent]["sq_drmas"] <= 1.0  # (n_kg - 1) / n_kg per non-constant group
        assert m[agent]["sq_grpo"] == pytest.approx(m["solver"]["sq_grpo"])  # episode-level: same for all agents
    assert m["solver"]["sq_pooled"] > 2.0 > m["solver"]["sq_drmas"]
    assert m["solver"]["gap"] > 0.5 > m["verifier"]["gap"]
    # The calls-weighted mean of the pooled second moments stays near 1: one agent's excess is the others' deficit.
    total = sum(m[k]["n"] * m[k]["sq_pooled"] for k in m) / sum(m[k]["n"] for k in m)
    assert 0.8 < total <= 1.0


def test_trajectory_rows_become_per_step_keyed_calls(tmp_path):
    rows = [
        {"step": 1, "group": 0, "episode": 0, "calls": [{"agent": "s", "reward": 1.0}, {"agent": "v", "reward": 0.9}]},
        {"step": 2, "group": 0, "episode": 0, "calls": [{"agent": "s", "reward": 0.0}]},
    ]
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    calls = calls_from_trajectories(read_jsonl(path))
    assert calls["group_ids"].tolist() == ["1/0", "1/0", "2/0"]  # step 2's group 0 is another group
    assert calls["episode_ids"].tolist() == ["1/0", "1/0", "2/0"]
    assert calls["rewards"].tolist() == [1.0, 0.9, 0.0] and calls["agent_ids"].tolist() == ["s", "v", "s"]
    path.write_text(json.dumps(rows[0]) + "\n{oops\n")
    with pytest.raises(ValueError, match="trajectories.jsonl:2"):
        read_jsonl(path)
