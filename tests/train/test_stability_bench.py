"""benchmarks/stability: the run driver's commands, the report's tables, the synthetic analysis."""

import importlib.util
import json
import shlex
import sys
from pathlib import Path

import pytest

from drmas_train.cli import parse_train_args

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "stability"


def load(name):
    spec = importlib.util.spec_from_file_location(f"stability_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_driver_commands_are_valid_trainer_command_lines(capsys, tmp_path):
    run = load("run")
    argv = ["--name", "x", "--preset", "smoke", "--steps", "3", "--estimators", "grpo,drmas", "--seeds", "0,7"]
    assert run.main([*argv, "--runs-dir", str(tmp_path), "--set", "learner.lr=0.01", "--dry-run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4
    seen = set()
    for line in lines:
        cmd = shlex.split(line)
        assert cmd[1:3] == ["-m", "drmas_train"]
        args, overrides = parse_train_args(cmd[3:])  # the real CLI parser accepts every flag
        assert args.preset == "smoke" and overrides["steps"] == 3 and overrides["learner.lr"] == 0.01
        seen.add((overrides["algo.estimator"], overrides["seed"]))
        assert overrides["log.run_dir"] == str(tmp_path / "x" / f"{overrides['algo.estimator']}-s{overrides['seed']}")
    assert seen == {("grpo", 0), ("grpo", 7), ("drmas", 0), ("drmas", 7)}
    with pytest.raises(SystemExit):
        run.parse_args(["--name", "x", "--estimators", "ppo"])


def test_driver_rounds_advance_every_run_before_the_next_round(capsys, tmp_path):
    run = load("run")
    assert run.round_targets(10, None) == [10]
    assert run.round_targets(10, 4) == [4, 8, 10]
    assert run.round_targets(10, 10) == [10]
    argv = ["--name", "x", "--preset", "smoke", "--steps", "5", "--estimators", "grpo,drmas", "--round-steps", "3"]
    assert run.main([*argv, "--runs-dir", str(tmp_path), "--dry-run"]) == 0
    order = []
    for line in capsys.readouterr().out.strip().splitlines():
        args, overrides = parse_train_args(shlex.split(line)[3:])
        assert args.resume  # each round continues the run from its checkpoint
        order.append((overrides["steps"], overrides["algo.estimator"]))
    assert order == [(3, "grpo"), (3, "drmas"), (5, "grpo"), (5, "drmas")]


def write_run(folder: Path, estimator: str, norms: list, skipped: list, seed: int = 0, scale: float = 1) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"seed: {seed}\nalgo:\n  estimator: {estimator}\n")
    rows = []
    for i, (n, s) in enumerate(zip(norms, skipped)):
        rows.append(
            {
                "step": i + 1,
                "accuracy": scale * i / 10,
                "reward/team": i / 10,
                "reward/solver": 0.5,
                "valid/solver": scale * i / 10,
                "time/step": 10.0,
                "grad_norm/shared": n,
                "learner/shared/skipped": s,
                "adv/solver/sq_mean": 0.5,
                "adv_global/solver/sq_mean": 2.0,
                "adv_global/solver/gap": 0.25,
            }
        )
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_report_tables_on_known_runs(tmp_path):
    report = load("report")
    # grpo: norms 1 1 1 10 nan 0 1 -> median 1 (finite non-zero), max 10, a spike at 10, one skipped, one zero.
    grpo = write_run(tmp_path / "g", "grpo", [1, 1, 1, 10, "nan", 0, 1], [0, 0, 0, 0, 1, 0, 0])
    drmas = write_run(tmp_path / "d", "drmas", [2, 2, 2, 2, 2, 2, 2], [0] * 7)
    readme = report.write_report([grpo, drmas], tmp_path / "out", title="T", command="cmd")
    text = readme.read_text()
    # final accuracy = mean of the last five steps' i/10 for i = 2..6 = 0.4
    # grpo's usable norms 1 1 1 10 1: median 1, p90 1 + 0.6 * 9 = 6.4, max 10
    assert "| grpo | shared | 1 | 1 | 6.4 | 10 | 10 | 1 | 1 | 1 | 0.4 | 0.4 |" in text
    assert "| drmas | shared | 1 | 2 | 2 | 2 | 1 | 0 | 0 | 0 | 0.4 | 0.4 |" in text
    assert "| grpo | solver | 0.5 | 2 | 0.25 | 0.5 |" in text
    # learning table: 7 steps in windows 1-3 / 4-5 / 6-7; valid and accuracy are i/10 for i = 0..6
    assert "Mean over steps 1-3 / 4-5 / 6-7" in text
    assert "| grpo | 0.10 / 0.35 / 0.55 | 0.10 / 0.35 / 0.55 | 10 |" in text
    assert "| grpo s0 | 0.10" not in text  # one run per estimator: no per-run learning rows
    for png in ("grad_norm_shared.png", "rewards.png", "adv_sq_mean.png"):
        assert (tmp_path / "out" / png).stat().st_size > 1000 and f"]({png})" in text
    # Capped at 3 steps, grpo's spike at step 4 is out: every norm is 1.
    capped = report.write_report([grpo, drmas], tmp_path / "capped", title="T", max_steps=3).read_text()
    assert "Steps per run: 3 (capped at 3)." in capped
    assert "| grpo | shared | 1 | 1 | 1 | 1 | 1 | 0 | 0 | 0 |" in capped


def test_synthetic_analysis_writes_table_and_plot(tmp_path):
    synthetic = load("synthetic")
    assert synthetic.main(["--groups", "24", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "README.md").read_text()
    for scenario in synthetic.SCENARIOS:
        assert f"| {scenario} | solver |" in text
    assert "## Reading" in text and (tmp_path / "second_moments.png").stat().st_size > 1000


@pytest.mark.slow
def test_driver_end_to_end_on_the_smoke_preset(tmp_path, capsys):
    run = load("run")
    # One estimator keeps it short: the point is the chain driver -> drmas-train -> metrics keys -> report.
    argv = ["--name", "e2e", "--preset", "smoke", "--steps", "2", "--estimators", "drmas", "--seeds", "0"]
    argv += ["--set", "threads=1"]  # a tiny model: intra-op threads only contend on a busy 2-core machine
    assert run.main([*argv, "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "README.md").read_text()
    assert text.startswith("# Stability: out\n")  # titled by its results folder, not the runs' --name
    assert "| drmas | shared | 1 |" in text and "| drmas s0 | shared | 2 |" in text
    assert "| drmas | solver |" in text and "| drmas | verifier |" in text  # the per-agent moments were logged
    # a finished run is not run again
    metrics = tmp_path / "runs" / "e2e" / "drmas-s0" / "metrics.jsonl"
    mtime = metrics.stat().st_mtime
    assert run.main([*argv, "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    assert metrics.stat().st_mtime == mtime


def test_learning_table_has_a_row_per_seed_when_seeds_differ(tmp_path):
    report = load("report")
    first = write_run(tmp_path / "g0", "grpo", [1] * 4, [0] * 4)
    second = write_run(tmp_path / "g1", "grpo", [1] * 4, [0] * 4, seed=1, scale=2)
    text = report.write_report([first, second], tmp_path / "out", title="T").read_text()
    # 4 steps in windows 1-2 / 3 / 4; seed 0's rates are i/10, seed 1's 2i/10, the estimator row their mean
    assert "| grpo | 0.08 / 0.30 / 0.45 | 0.08 / 0.30 / 0.45 | 10 |" in text
    assert "| grpo s0 | 0.05 / 0.20 / 0.30 | 0.05 / 0.20 / 0.30 | 10 |" in text
    assert "| grpo s1 | 0.10 / 0.40 / 0.60 | 0.10 / 0.40 / 0.60 | 10 |" in text
