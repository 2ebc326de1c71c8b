"""Baseline-key diagnostics: hand-built batches checked by hand, the warnings, and a real smoke run's logs."""

import json
import logging
import subprocess
import sys

import numpy as np
import pytest

from drmas_train.algorithm.advantages import compute_advantages
from drmas_train.algorithm.group_stats import GroupWarnings, group_stats
from drmas_train.cli.main import _progress_line
from drmas_train.config import build_config
from drmas_train.run.trainer import Trainer

STATS = ("singleton_share", "zero_var_share", "size_min", "size_median", "size_max")

# Two prompts, four episodes. Prompt 0: episodes 0 and 1, Solver then Verifier each. Prompt 1: episode 2
# makes Solver, Verifier, Solver; episode 3 stops after a malformed Solver call (penalty 0.1, no Verifier).
BATCH = dict(
    rewards=[1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.9],
    group_ids=[0, 0, 0, 0, 1, 1, 1, 1],
    agent_ids=["solver", "verifier", "solver", "verifier", "solver", "verifier", "solver", "solver"],
    episode_ids=[0, 0, 1, 1, 2, 2, 2, 3],
)


def _stats(agent, values):
    return {f"groups/{agent}/{k}": v for k, v in zip(STATS, values)}


def test_drmas_keys_by_hand():
    # (0, solver) = [1, 0]: signal. (0, verifier) = [1, 1]: all equal. (1, solver) = [0, 0, 0.9]: signal.
    # (1, verifier) = [0]: one sample. Solver: 5 calls, keys of 2 and 3. Verifier: 3 calls, 1 alone, 2 flat.
    out = group_stats(**BATCH, estimator="drmas")
    assert out == pytest.approx(
        {**_stats("solver", (0, 0, 2, 2.5, 3)), **_stats("verifier", (1 / 3, 2 / 3, 1, 1.5, 2))}
    )
    assert list(out)[:5] == [f"groups/solver/{k}" for k in STATS]  # agents in first-seen order


def test_the_two_shares_are_the_calls_whose_drmas_advantage_is_zero_by_rule():
    adv = np.asarray(compute_advantages(**BATCH, estimator="drmas"))
    out = group_stats(**BATCH, estimator="drmas")
    agents = np.array(BATCH["agent_ids"])
    for agent in ("solver", "verifier"):
        zero = float(np.mean(adv[agents == agent] == 0.0))
        assert out[f"groups/{agent}/singleton_share"] + out[f"groups/{agent}/zero_var_share"] == pytest.approx(zero)


def test_pooled_and_episode_level_keys_by_hand():
    # pooled: prompt 0 = [1, 1, 0, 1], prompt 1 = [0, 0, 0, 0.9]: every key has 4 calls and contrast.
    pooled = group_stats(**BATCH, estimator="pooled")
    assert pooled == pytest.approx({**_stats("solver", (0, 0, 4, 4, 4)), **_stats("verifier", (0, 0, 4, 4, 4))})
    # grpo / rloo: episode scores 1, 0.5 (prompt 0) and 0, 0.9 (prompt 1): keys of 2 episodes with contrast.
    for estimator in ("grpo", "rloo"):
        out = group_stats(**BATCH, estimator=estimator)
        assert out == pytest.approx({**_stats("solver", (0, 0, 2, 2, 2)), **_stats("verifier", (0, 0, 2, 2, 2))})


def test_group_size_one_and_a_constant_reward():
    # One episode per prompt; the Solver is called once per episode, the Verifier twice with equal rewards.
    batch = dict(
        rewards=[0.0, -0.1, -0.1, 1.0, 0.9, 0.9],
        group_ids=["a", "a", "a", "b", "b", "b"],
        agent_ids=["solver", "verifier", "verifier"] * 2,
        episode_ids=[0, 0, 0, 1, 1, 1],
    )
    drmas = group_stats(**batch, estimator="drmas")
    assert drmas == pytest.approx({**_stats("solver", (1, 0, 1, 1, 1)), **_stats("verifier", (0, 1, 2, 2, 2))})
    grpo = group_stats(**batch, estimator="grpo")  # one episode per key: every call alone
    assert grpo == pytest.approx({**_stats("solver", (1, 0, 1, 1, 1)), **_stats("verifier", (1, 0, 1, 1, 1))})


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown estimator 'ppo'"):
        group_stats(**BATCH, estimator="ppo")
    with pytest.raises(ValueError, match="lengths differ: rewards 7"):
        group_stats(**{**BATCH, "rewards": BATCH["rewards"][:7]})
    assert group_stats([], group_ids=[], agent_ids=[], episode_ids=[]) == {}


def test_warnings_name_the_cause_once_per_agent_and_kind():
    warn = GroupWarnings(0.9, estimator="drmas", group_size=1)
    row = {"step": 1, **_stats("solver", (1.0, 0, 1, 1, 1)), **_stats("verifier", (0.5, 0.5, 1, 1.5, 2))}
    (msg,) = warn.check(row, ["solver", "verifier"])
    assert "100% of solver's calls" in msg and "of one sample" in msg and "rollout.group_size is 1" in msg
    assert "REINFORCE" in msg and "(prompt group, agent)" in msg
    assert warn.check({**row, "step": 2}, ["solver", "verifier"]) == []  # once per run
    row = {"step": 3, "valid/verifier": 0.0, "accuracy": 0.0, **_stats("verifier", (0, 0.95, 2, 2, 2))}
    (msg,) = warn.check(row, ["solver", "verifier"])
    assert "95% of verifier's calls" in msg and "rewards are all equal" in msg and "format looks unreachable" in msg


def test_flat_keys_with_well_formed_calls_blame_the_task_difficulty():
    warn = GroupWarnings(0.5, estimator="grpo", group_size=4)
    (msg,) = warn.check(
        {"step": 1, "valid/solver": 1.0, "accuracy": 0.0, **_stats("solver", (0, 1, 4, 4, 4))}, ["solver"]
    )
    assert "episodes of a prompt all ended alike (accuracy 0.00)" in msg and "prompt group over episodes" in msg


def test_a_singleton_with_groups_names_the_agents_reach():
    warn = GroupWarnings(0.9, estimator="drmas", group_size=4)
    (msg,) = warn.check({"step": 1, "calls/verifier": 0.25, **_stats("verifier", (1, 0, 1, 1, 1))}, ["verifier"])
    assert "reached in only one episode of most groups (calls/verifier 0.25 per episode)" in msg


def test_the_threshold_none_or_out_of_range():
    row = {"step": 1, **_stats("solver", (1.0, 1.0, 1, 1, 1))}
    assert GroupWarnings(None, estimator="drmas", group_size=1).check(row, ["solver"]) == []
    assert len(GroupWarnings(1.0, estimator="drmas", group_size=1).check(row, ["solver"])) == 2
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"in \(0, 1\] or None"):
            GroupWarnings(bad, estimator="drmas", group_size=1)


def test_a_bad_threshold_on_the_command_line_is_one_line(tmp_path, capsys):
    from drmas_train.cli import main

    code = main(["--preset", "smoke", "--run-dir", str(tmp_path / "run"), "--set", "algo.group_warn_share=2"])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "algo.group_warn_share must be in (0, 1] or None, got 2" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_the_progress_line_shows_both_shares():
    row = {"reward/team": 0.5, "accuracy": 0.5, "grad_norm/shared": 1.0, "time/step": 2.0, "reward/solver": 0.5}
    row.update({"valid/solver": 1.0, **_stats("solver", (0.25, 0.5, 1, 2, 4))})
    assert "solver: r 0.50 valid 1.00 solo 0.25 flat 0.50 |" in _progress_line(row, ["solver"])


def test_a_smoke_run_logs_warns_and_plots_them(tmp_path, caplog):
    # Group size 1: every episode is its prompt's only one, and every episode is logged, so the logged
    # calls rebuild the whole step's batch.
    run = tmp_path / "run"
    overrides = {"log.run_dir": str(run), "steps": 1, "rollout.group_size": 1, "log.trajectories_per_step": 8}
    cfg = build_config("smoke", {**overrides, "eval.every": 0, "eval.before_train": False})
    with caplog.at_level(logging.WARNING, logger="drmas_train.run.trainer"):
        Trainer(cfg).train()
    (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    episodes = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    calls = [c | {"group": ep["group"], "episode": ep["episode"]} for ep in episodes for c in ep["calls"]]
    assert len(calls) == row["calls"]
    rebuilt = group_stats(
        [c["reward"] for c in calls],
        group_ids=[c["group"] for c in calls],
        agent_ids=[c["agent"] for c in calls],
        episode_ids=[c["episode"] for c in calls],
    )
    assert {k: row[k] for k in rebuilt} == pytest.approx(rebuilt)
    assert {f"groups/{a}/{s}" for a in ("solver", "verifier") for s in STATS} <= set(row)
    alone = [a for a in ("solver", "verifier") if row[f"groups/{a}/singleton_share"] >= 0.9]
    assert alone, row  # the Solver is called once in most of its episodes
    warned = [r.getMessage() for r in caplog.records if "of one sample" in r.getMessage()]
    assert len(warned) == len(alone) and all("rollout.group_size is 1" in m for m in warned)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    assert {f"groups/{a}/singleton_share" for a in ("solver", "verifier")} <= set(events.Tags()["scalars"])

    out = tmp_path / "curves.png"
    code = (
        f"import json, runpy, sys; sys.argv = ['plot_run.py', {str(run)!r}, '--out', {str(out)!r}]; "
        "mod = runpy.run_module('drmas_benchmarks.plot_run', run_name='__main__'); "
        f"print(json.dumps(mod['group_panels']([json.loads(open({str(run / 'metrics.jsonl')!r}).read())])))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.stat().st_size > 0
    shares, sizes = (keys for _, keys in json.loads(done.stdout))
    assert shares == [f"groups/{a}/{s}" for a in ("solver", "verifier") for s in ("singleton_share", "zero_var_share")]
    assert sizes == [f"groups/{a}/{s}" for a in ("solver", "verifier") for s in ("size_max", "size_median", "size_min")]
