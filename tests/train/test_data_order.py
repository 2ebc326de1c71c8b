"""Steps per epoch and the data cursor follow the reference's loader: whole batches of one pass, the last
partial batch dropped, `epochs` x floor(tasks / prompts_per_step) steps; `plan` counts the same."""

import json

import numpy as np
import pytest
import yaml

from drmas_train.cli import main
from drmas_train.config import build_config, data_slot, steps_for_epochs, steps_per_epoch
from drmas_train.run.trainer import Trainer


def batches(n_tasks: int, per_step: int, steps: int, start: int = 0, seed: int = 0) -> list[tuple[int, list[int]]]:
    """(pass, task indices) of `steps` batches from data position `start`, as the trainer walks them."""
    out, position = [], start
    for _ in range(steps):
        epoch, offset = data_slot(position, n_tasks, per_step)
        order = np.random.default_rng(seed + epoch).permutation(n_tasks)
        out.append((epoch, [int(i) for i in order[offset : offset + per_step]]))
        position += per_step
    return out


def test_steps_are_epochs_times_whole_batches_per_pass():
    assert steps_per_epoch(10, 3) == 3 and steps_per_epoch(9, 3) == 3 and steps_per_epoch(3, 3) == 1
    assert steps_for_epochs(2, 10, 3) == 6  # ceil(20 / 3) = 7 would mix a pass into another's batch
    assert steps_for_epochs(1.5, 10, 3) == 4 and steps_for_epochs(0.01, 10, 3) == 1
    with pytest.raises(ValueError, match="fewer than rollout.prompts_per_step 4"):
        steps_per_epoch(3, 4)


@pytest.mark.parametrize("n_tasks, per_step", [(10, 3), (9, 3), (7, 2), (5, 5)])
def test_no_batch_mixes_two_passes_and_no_task_repeats_within_a_pass(n_tasks, per_step):
    walked = batches(n_tasks, per_step, steps=4 * steps_per_epoch(n_tasks, per_step))
    per_pass: dict[int, list[int]] = {}
    for epoch, tasks in walked:
        assert len(tasks) == per_step
        per_pass.setdefault(epoch, []).extend(tasks)
    assert sorted(per_pass) == [0, 1, 2, 3]
    for tasks in per_pass.values():
        assert len(tasks) == len(set(tasks)) == steps_per_epoch(n_tasks, per_step) * per_step


def test_a_resume_mid_pass_continues_the_same_walk():
    whole = batches(10, 3, steps=8)
    for stop in range(1, 8):  # a checkpoint after `stop` steps saves the cursor stop x 3
        assert batches(10, 3, steps=8 - stop, start=3 * stop) == whole[stop:]


def test_a_resume_with_another_batch_size_starts_the_next_pass_rather_than_mix_two():
    # 9 tasks consumed at 3 a step (the end of pass 0's whole batches), resumed at 4 a step: pass 0 holds 8.
    assert data_slot(9, 10, 4) == (1, 1)
    assert data_slot(6, 10, 4) == (1, 0)  # 6..9 would run past pass 0's 8 tasks


@pytest.mark.slow
def test_a_one_epoch_run_on_a_local_file_runs_the_planned_steps(tmp_path, capsys):
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(1, 6)]
    data = tmp_path / "math.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sets = ["--set", f"env.kwargs.dataset={data}", "--set", "epochs=1", "--set", "eval.every=0"]
    sets += ["--set", "eval.before_train=false"]
    assert main(["plan", "--preset", "smoke", "--json", *sets]) == 0
    plan = json.loads(capsys.readouterr().out)
    per_step = build_config("smoke", {}).rollout.prompts_per_step
    assert plan["steps"] == 1 * (5 // per_step) == plan["steps_per_epoch"] and plan["epochs"] == 1
    run = tmp_path / "run"
    assert main(["--preset", "smoke", "--run-dir", str(run), *sets]) == 0
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, plan["steps"] + 1))


def test_a_run_records_the_rows_it_skipped_in_its_provenance(tmp_path):
    """`env.kwargs.bad_rows: skip`: the run starts, and config.yaml says how many rows it left out and where."""
    data = tmp_path / "train.jsonl"
    rows = [json.dumps({"problem": f"What is {i} + 1?", "answer": str(i + 1)}) for i in range(12)]
    data.write_text("\n".join([rows[0], "{broken", *rows[1:], '{"problem": "no answer"}']) + "\n")
    overrides = {"log.run_dir": str(tmp_path / "run"), "env.kwargs.dataset": str(data), "env.kwargs.bad_rows": "skip"}
    trainer = Trainer(build_config("smoke", overrides))
    try:
        saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
        train = saved["data_provenance"]["train"]
        assert train["n"] == 12 and train["skipped_rows"] == 2
        assert "train.jsonl:2" in train["first_skipped"][0] and "train.jsonl:14" in train["first_skipped"][1]
    finally:
        trainer.close()
