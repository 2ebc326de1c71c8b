"""drmas_benchmarks.stability: the run driver's commands, the report's tables, the synthetic analysis."""

import json
import math
import shlex
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from drmas_benchmarks.stability import heldout, report, run, synthetic
from drmas_train.cli import parse_train_args


def test_driver_commands_are_valid_trainer_command_lines(capsys, tmp_path):
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


def test_driver_pins_the_held_out_protocol_for_every_run(capsys, tmp_path):
    argv = ["--name", "x", "--preset", "smoke", "--estimators", "grpo,drmas", "--seeds", "0,1", "--eval-every", "5"]
    argv += ["--eval-problems", "16", "--eval-k", "3", "--set", "eval.k=7", "--runs-dir", str(tmp_path), "--dry-run"]
    assert run.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4
    for line in lines:
        _, overrides = parse_train_args(shlex.split(line)[3:])
        # the same problems for every estimator and seed; an explicit --set wins over the flag
        assert overrides["eval.seed"] == 0 and overrides["eval.every"] == 5 and overrides["eval.n_problems"] == 16
        assert overrides["eval.k"] == 7
    assert run.main(["--name", "x", "--preset", "smoke", "--runs-dir", str(tmp_path), "--dry-run"]) == 0
    _, overrides = parse_train_args(shlex.split(capsys.readouterr().out.splitlines()[0])[3:])
    assert overrides["eval.seed"] == 0 and "eval.every" not in overrides  # unset flags keep the preset's


def test_the_step_0_validation_row_is_no_training_step(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    assert run.trained_steps(folder) == 0
    rows = [{"step": 0, "val/avg@1": 0.25}, {"step": 1, "accuracy": 0.5}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert run.trained_steps(folder) == 1
    assert not run.is_complete(folder, 2)  # two rows, but one step: the run must still be resumed
    assert run.is_complete(folder, 1)


def test_driver_rounds_advance_every_run_before_the_next_round(capsys, tmp_path):
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


def write_run(
    folder: Path,
    estimator: str,
    norms: list,
    skipped: list,
    seed: int = 0,
    scale: float = 1,
    val: dict | None = None,
    lr: float = 0.001,
) -> Path:
    """A run folder; `val` maps a step to its `val/*` metrics (step 0: a row of its own, as the trainer writes)."""
    folder.mkdir(parents=True)
    config = f"seed: {seed}\nalgo:\n  estimator: {estimator}\nlearner:\n  lr: {lr}\nlog:\n  run_dir: {folder}\n"
    config += "eval:\n  k: 2\n  n_problems: 4\n  seed: 0\n  split: test\n  temperature: 0.6\n  top_p: 0.95\n"
    (folder / "config.yaml").write_text(config)
    val = val or {}
    rows = [{"step": 0, **val[0]}] if 0 in val else []
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
                **val.get(i + 1, {}),
            }
        )
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_report_tables_on_known_runs(tmp_path):
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
    assert synthetic.main(["--groups", "24", "--out", str(tmp_path)]) == 0
    text = (tmp_path / "README.md").read_text()
    for scenario in synthetic.SCENARIOS:
        assert f"| {scenario} | solver |" in text
    assert "## Reading" in text and (tmp_path / "second_moments.png").stat().st_size > 1000


def test_t_quantile_and_interval_by_hand():
    # closed forms of Student's t: df 1 is Cauchy, tan(pi (p - 1/2)); df 2: (2p - 1) sqrt(2 / (4 p (1 - p)))
    assert heldout.t_quantile(0.975, 1) == pytest.approx(math.tan(0.475 * math.pi), abs=1e-7)  # 12.7062
    assert heldout.t_quantile(0.975, 2) == pytest.approx(0.95 * math.sqrt(2 / (4 * 0.975 * 0.025)), abs=1e-7)
    assert heldout.t_quantile(0.95, 2) == pytest.approx(0.9 * math.sqrt(2 / (4 * 0.95 * 0.05)), abs=1e-7)
    # 0.1, 0.2, 0.3: mean 0.2, sd 0.1, half-width t(0.975, 2) * 0.1 / sqrt(3) = 0.248414
    iv = heldout.t_interval([0.1, 0.2, float("nan"), 0.3])  # NaN (a missing metric) is no seed
    assert (iv.n, iv.mean) == (3, pytest.approx(0.2))
    assert (iv.low, iv.high) == (pytest.approx(0.2 - 0.248414, abs=1e-6), pytest.approx(0.2 + 0.248414, abs=1e-6))
    one = heldout.t_interval([0.5])
    assert one.n == 1 and one.mean == 0.5 and math.isnan(one.low) and math.isnan(one.high)
    assert heldout.t_interval([]).n == 0
    assert heldout.reading(iv) == "contains 0"
    assert heldout.reading(heldout.Interval(0.1, 0.05, 0.15, 2)) == "above 0"
    assert heldout.reading(heldout.Interval(-0.1, -0.15, -0.05, 2)) == "below 0"
    with pytest.raises(ValueError):
        heldout.t_quantile(0.4, 3)


def test_paired_differences_and_gains_by_hand():
    # seed 3 has no drmas run and seed 4's grpo value is missing: only seeds 0-2 pair
    drmas = {0: 0.3, 1: 0.1, 2: 0.2, 4: 0.1}
    grpo = {0: 0.1, 1: 0.1, 2: 0.0, 3: 0.5, 4: float("nan")}
    diffs = heldout.paired_differences(drmas, grpo)
    assert list(diffs) == [0, 1, 2] and list(diffs.values()) == pytest.approx([0.2, 0.0, 0.2])
    # mean 2/15, sd sqrt(0.04/3), se sd / sqrt(3) = 0.0666667, half-width 4.302653 * 0.0666667 = 0.286844
    iv = heldout.t_interval(diffs.values())
    assert iv.mean == pytest.approx(0.133333, abs=1e-6) and iv.high - iv.mean == pytest.approx(0.286844, abs=1e-6)
    rows = [{"step": 0, "val/avg@1": 0.25}, {"step": 1, "accuracy": 1.0}, {"step": 2, "val/avg@1": 0.5}]
    values = heldout.curve(rows, "val/avg@1")
    assert values == {0: 0.25, 2: 0.5}
    assert heldout.gain(values, 0, 2) == 0.25 and math.isnan(heldout.gain(values, 0, 4))
    assert heldout.config_diff({"a": {"b": 1, "c": 2}, "steps": 3}, {"a": {"b": 1, "c": 5}, "steps": 9}) == ["a.c"]
    # a field one run's trainer version lacks is no difference, but it is named
    older, newer = {"a": {"b": 1}}, {"a": {"b": 1, "new": "all"}}
    assert heldout.config_diff(older, newer) == [] and heldout.one_sided(older, newer) == ["a.new"]
    # runs validated on different problems are flagged, not compared silently
    same = SimpleNamespace(config={"eval": {"k": 2, "seed": 0}}, val_rows=rows)
    other = SimpleNamespace(config={"eval": {"k": 2, "seed": 1}}, val_rows=rows)
    assert "protocols differ" not in "".join(heldout.protocol([same, same]))
    assert "**The runs' validation protocols differ** (eval.seed)" in "".join(heldout.protocol([same, other]))


def _val(avg1: float, acc: float, avg2: float) -> dict:
    return {"val/avg@1": avg1, "val/answer_acc": acc, "val/avg@2": avg2, "val/n_problems": 4.0}


def test_report_held_out_section_on_known_runs(tmp_path):
    norms, skipped = [1] * 4, [0] * 4

    def run(name, est, seed, first, mid, last, **kw):  # validation before training, after steps 2 and 4
        val = {0: _val(first, first, first), 2: _val(mid, mid, mid), 4: _val(last, last + 0.1, last)}
        return write_run(tmp_path / name, est, norms, skipped, seed=seed, val=val, **kw)

    runs = [
        run("g0", "grpo", 0, 0.30, 0.30, 0.35),  # gain +0.05
        run("g1", "grpo", 1, 0.40, 0.40, 0.40),  # gain 0
        run("d0", "drmas", 0, 0.30, 0.40, 0.45),  # gain +0.15, paired +0.10
        run("d1", "drmas", 1, 0.40, 0.40, 0.55),  # gain +0.15, paired +0.15
        run("d2", "drmas", 2, 0.20, 0.20, 0.20),  # no grpo seed 2
        run("p0", "pooled", 0, 0.30, 0.30, 0.30, lr=0.01),  # not the same config as grpo s0
    ]
    text = report.write_report(runs, tmp_path / "out", title="T").read_text()
    assert "Steps per run: 4." in text  # the step-0 validation row is no training step
    assert "Mean over steps 1-2 / 3-3 / 4-4" in text
    assert "## Held-out accuracy" in text and "4 problems of split `test`" in text
    assert "| run | metric | step 0 | step 2 | step 4 |" in text
    assert "| drmas s0 | val/avg@1 | 0.300 | 0.400 | 0.450 |" in text
    assert "| drmas s0 | val/answer_acc | 0.300 | 0.400 | 0.550 |" in text
    # drmas gains 0.15, 0.15, 0 (s2): mean 0.1, sd 0.0866025, half-width 4.302653 * 0.05 = 0.215133
    assert "| drmas | val/avg@1 | 0 -> 4 | 3 | s0 +0.150, s1 +0.150, s2 +0.000 | +0.100 | [-0.115, +0.315] |" in text
    # grpo gains 0.05, 0: mean 0.025, half-width 12.706205 * 0.025 = 0.317655
    assert "| grpo | val/avg@1 | 0 -> 4 | 2 | s0 +0.050, s1 +0.000 | +0.025 | [-0.293, +0.343] | contains 0 |" in text
    assert "| pooled | val/avg@2 | 0 -> 4 | 1 | s0 +0.000 | +0.000 | n/a (n < 2) |" in text
    # paired: drmas - grpo on seeds 0, 1: 0.10, 0.15 -> mean 0.125, half-width 12.706205 * 0.025 = 0.317655
    assert "| drmas - grpo | val/avg@1 | 0 -> 4 | 2 | s0 +0.100, s1 +0.150 | +0.125 | [-0.193, +0.443] |" in text
    assert "| drmas - grpo | val/answer_acc | 0 -> 4 | 2 | s0 +0.100, s1 +0.150 | +0.125 |" in text
    assert "| pooled - grpo |" not in text
    assert "Not paired: drmas s2: no grpo run with seed 2." in text
    assert "Not paired: pooled s0: config differs from grpo s0 in learner.lr." in text
    assert "Paired across trainer versions" not in text
    assert "protocols differ" not in text
    assert (tmp_path / "out" / "heldout.png").stat().st_size > 1000 and "](heldout.png)" in text
    # capped at 2 steps, the gains run from step 0 to step 2
    capped = report.write_report(runs[:4], tmp_path / "capped", title="T", max_steps=2).read_text()
    assert "| drmas - grpo | val/avg@1 | 0 -> 2 | 2 | s0 +0.100, s1 +0.000 | +0.050 |" in capped
    # runs without validation (older benchmarks) get no held-out section
    plain = write_run(tmp_path / "plain", "grpo", norms, skipped)
    assert "Held-out" not in report.write_report([plain], tmp_path / "plain_out", title="T").read_text()


@pytest.mark.slow
def test_driver_end_to_end_on_the_smoke_preset(tmp_path, capsys):
    # One estimator keeps it short: the point is the chain driver -> drmas-train -> metrics keys -> report.
    argv = ["--name", "e2e", "--preset", "smoke", "--steps", "2", "--estimators", "drmas", "--seeds", "0"]
    argv += ["--set", "threads=1"]  # a tiny model: intra-op threads only contend on a busy 2-core machine
    # rounds of one step: the second round resumes the run, which must keep its step-0 validation
    argv += ["--round-steps", "1", "--eval-every", "2", "--eval-problems", "4", "--eval-k", "2"]
    assert run.main([*argv, "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "README.md").read_text()
    assert text.startswith("# Stability: out\n")  # titled by its results folder, not the runs' --name
    assert "| drmas | shared | 1 |" in text and "| drmas s0 | shared | 2 |" in text
    assert "| drmas | solver |" in text and "| drmas | verifier |" in text  # the per-agent moments were logged
    metrics = tmp_path / "runs" / "e2e" / "drmas-s0" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    # step 0 once (before training, kept through the resume), then steps 1 (a round's end) and 2 validated
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all("val/avg@1" in r and "val/answer_acc" in r and "val/avg@2" in r for r in rows)
    assert rows[0]["val/n_problems"] == 4 and "accuracy" not in rows[0]
    # the held-out section holds the runs' own numbers
    assert "## Held-out accuracy" in text and "4 problems of split `test`" in text
    for key in ("val/avg@1", "val/answer_acc", "val/avg@2"):
        values = " | ".join(f"{r[key]:.3f}" for r in rows)
        assert f"| drmas s0 | {key} | {values} |" in text
        gain = heldout.signed(rows[2][key] - rows[0][key])
        assert f"| drmas | {key} | 0 -> 2 | 1 | s0 {gain} | {gain} | n/a (n < 2) |" in text
    assert (tmp_path / "out" / "heldout.png").stat().st_size > 1000
    # the report reads the archive beside it, which holds the run's config and metrics
    copy = tmp_path / "out" / "runs" / "drmas-s0"
    assert (copy / "metrics.jsonl").read_text() == metrics.read_text()
    assert f"Runs: `{copy}`." in text
    # a finished run is not run again
    mtime = metrics.stat().st_mtime
    assert run.main([*argv, "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    assert metrics.stat().st_mtime == mtime
    # with the run folder gone (a new machine), the report is rebuilt from the archive alone
    shutil.rmtree(tmp_path / "runs")
    (tmp_path / "out" / "README.md").unlink()
    assert run.main([*argv, "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--report-only"]) == 0
    assert (tmp_path / "out" / "README.md").read_text() == text


def test_archive_keeps_the_longest_copy_of_a_run(tmp_path):
    grpo = write_run(tmp_path / "g", "grpo", [1, 1, 1], [0, 0, 0])
    copy = tmp_path / "out" / "runs" / "grpo-s0"
    assert run.archive(grpo, copy) and run.trained_steps(copy) == 3
    assert sorted(p.name for p in copy.iterdir()) == ["config.yaml", "metrics.jsonl"]
    assert not run.archive(grpo, copy)  # nothing new
    shorter = write_run(tmp_path / "g2", "grpo", [1], [0])  # a restarted run, one step in
    assert not run.archive(shorter, copy) and run.trained_steps(copy) == 3
    assert not run.archive(tmp_path / "missing", tmp_path / "out" / "runs" / "x")
    # an archived run that links to results kept elsewhere is replaced, not written through
    linked = tmp_path / "out" / "runs" / "grpo-s1"
    linked.symlink_to(shorter)
    assert run.archive(grpo, linked) and not linked.is_symlink() and run.trained_steps(linked) == 3
    assert run.trained_steps(shorter) == 1


def test_paired_runs_across_trainer_versions_name_the_new_fields(tmp_path):
    val = {0: _val(0.3, 0.3, 0.3), 2: _val(0.4, 0.4, 0.4)}
    grpo = write_run(tmp_path / "g", "grpo", [1, 1], [0, 0], val=val)
    drmas = write_run(tmp_path / "d", "drmas", [1, 1], [0, 0], val=val)
    config = drmas / "config.yaml"
    config.write_text(config.read_text() + "placement:\n  rollout_ranks: all\n")  # a field added later
    text = report.write_report([grpo, drmas], tmp_path / "out", title="T").read_text()
    assert "| drmas - grpo | val/avg@1 | 0 -> 2 | 1 |" in text
    note = "Paired across trainer versions: drmas s0 and grpo s0; fields only one of them has: placement.rollout_ranks"
    assert note in text


def test_drmas_is_also_paired_against_pooled_the_per_agent_statistics_alone(tmp_path):

    def run(est, seed, first, last):
        val = {0: _val(first, first, first), 2: _val(last, last, last)}
        return write_run(tmp_path / f"{est}{seed}", est, [1, 1], [0, 0], seed=seed, val=val)

    runs = [run("grpo", 0, 0.30, 0.35), run("grpo", 1, 0.40, 0.40)]  # gains +0.05, 0
    runs += [run("pooled", 0, 0.30, 0.50), run("pooled", 1, 0.40, 0.50)]  # +0.20, +0.10
    runs += [run("drmas", 0, 0.30, 0.45), run("drmas", 1, 0.40, 0.55)]  # +0.15, +0.15
    text = report.write_report(runs, tmp_path / "out", title="T").read_text()
    assert "| pooled - grpo | val/avg@1 | 0 -> 2 | 2 | s0 +0.150, s1 +0.100 | +0.125 |" in text
    assert "### Paired against pooled" in text and "differ only in drmas's per-agent statistics" in text
    assert "| drmas - pooled | val/avg@1 | 0 -> 2 | 2 | s0 -0.050, s1 +0.050 | +0.000 |" in text
    assert "| grpo - pooled |" not in text
    # without pooled runs there is nothing to pair drmas with
    alone = report.write_report(runs[:2] + runs[4:], tmp_path / "alone", title="T").read_text()
    assert "Paired against pooled" not in alone and "| drmas - grpo |" in alone


def test_learning_table_has_a_row_per_seed_when_seeds_differ(tmp_path):
    first = write_run(tmp_path / "g0", "grpo", [1] * 4, [0] * 4)
    second = write_run(tmp_path / "g1", "grpo", [1] * 4, [0] * 4, seed=1, scale=2)
    text = report.write_report([first, second], tmp_path / "out", title="T").read_text()
    # 4 steps in windows 1-2 / 3 / 4; seed 0's rates are i/10, seed 1's 2i/10, the estimator row their mean
    assert "| grpo | 0.08 / 0.30 / 0.45 | 0.08 / 0.30 / 0.45 | 10 |" in text
    assert "| grpo s0 | 0.05 / 0.20 / 0.30 | 0.05 / 0.20 / 0.30 | 10 |" in text
    assert "| grpo s1 | 0.10 / 0.40 / 0.60 | 0.10 / 0.40 / 0.60 | 10 |" in text


def test_learning_table_shows_reply_length_and_the_verifiers_approvals(tmp_path):
    path = write_run(tmp_path / "d0", "drmas", [1] * 3, [0] * 3)
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    for i, row in enumerate(rows):  # tokens 30, 20, 10; approvals of right 0.5, 1, 1 and of wrong 1, 0.5, 0
        row.update({"response_tokens/solver": 30 - 10 * i, "approve_right": min(0.5 + 0.5 * i, 1.0)})
        row["approve_wrong"] = 1 - 0.5 * i
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = report.write_report([path], tmp_path / "out", title="T").read_text()
    assert "| estimator | solver well-formed | solver reply tokens | approve right | approve wrong | accuracy |" in text
    assert (
        "| drmas | 0.00 / 0.10 / 0.20 | 30 / 20 / 10 | 0.50 / 1.00 / 1.00 | 1.00 / 0.50 / 0.00 | 0.00 / 0.10 / 0.20 |"
        in text
    )


def test_held_out_section_says_what_each_agent_learned(tmp_path):

    def val(valid, tokens, right, wrong):
        agent = {"val/valid/solver": valid, "val/response_tokens/solver": tokens}
        return {**_val(0.5, 0.5, 0.5), **agent, "val/approve_right": right, "val/approve_wrong": wrong}

    runs = [
        write_run(
            tmp_path / "d0", "drmas", [1] * 2, [0] * 2, val={0: val(0.2, 40, 0.4, 0.5), 2: val(1.0, 20, 0.9, 0.1)}
        ),
        write_run(
            tmp_path / "g0", "grpo", [1] * 2, [0] * 2, val={0: val(0.2, 40, 0.4, 0.5), 2: val(0.5, 12, 0.0, 0.0)}
        ),
    ]
    text = report.write_report(runs, tmp_path / "out", title="T").read_text()
    assert "| run | valid/solver | response_tokens/solver | approve_right | approve_wrong |" in text
    assert "| drmas s0 | 0.2 -> 1 | 40 -> 20 | 0.4 -> 0.9 | 0.5 -> 0.1 |" in text
    assert "| grpo s0 | 0.2 -> 0.5 | 40 -> 12 | 0.4 -> 0 | 0.5 -> 0 |" in text
