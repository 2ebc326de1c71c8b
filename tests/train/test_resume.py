"""Checkpoints: a real `drmas-train` process killed with SIGKILL resumes at its last checkpoint."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import safetensors.torch
import torch

from drmas_train.config import build_config
from drmas_train.run.checkpoint import latest_checkpoint, list_checkpoints, save_checkpoint
from drmas_train.run.trainer import Trainer


def _rows(run: Path):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _cli(*args):
    return [sys.executable, "-m", "drmas_train", "--preset", "smoke", *args]


def _kill_after_first_checkpoint(run, *args) -> int:
    """Start a 200-step smoke run, kill -9 it once a checkpoint exists; the checkpoint's step."""
    proc = subprocess.Popen(
        _cli("--run-dir", str(run), "--steps", "200", *args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 300
        while latest_checkpoint(run / "checkpoints") is None:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    return int(latest_checkpoint(run / "checkpoints").name.split("-")[1])


def test_kill_minus_9_then_resume(tmp_path):
    run = tmp_path / "run"
    done = _kill_after_first_checkpoint(run)
    assert 1 <= done < 200
    # Resume for one more step: the run continues at the checkpoint's step, data position and weights.
    out = subprocess.run(
        _cli("--run-dir", str(run), "--resume", "--steps", str(done + 1)), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = _rows(run)
    # rows after the checkpoint were dropped; step 0 is the validation before training, made once
    assert [r["step"] for r in rows] == [0, *range(1, done + 2)]
    assert rows[-1]["data/cursor"] == (done + 1) * 2  # 2 prompts per step in the smoke preset
    assert list_checkpoints(run / "checkpoints")[-1].name == f"step-{done + 1:06d}"

    # The same step in an uninterrupted run gives the same numbers (weights, optimizer, data, RNG restored).
    cfg = build_config("smoke", {"log.run_dir": str(tmp_path / "ref"), "steps": done + 1})
    ref = Trainer(cfg).train()[-1]
    for key in ("reward/mean", "reward/solver", "grad_norm/shared", "tokens/generated"):
        assert rows[-1][key] == ref[key], key


def test_incomplete_checkpoint_is_ignored(tmp_path):
    root = tmp_path / "checkpoints"
    save_checkpoint(root, 1, policies={}, learners={}, state={"cursor": 2})
    (root / "step-000002").mkdir()  # a folder without state.json: a save that was cut short
    (root / ".tmp-step-000003-1").mkdir()
    assert latest_checkpoint(root).name == "step-000001"


def test_kill_minus_9_with_rollouts_in_flight_loses_no_trained_step(tmp_path):
    """max_staleness 1: the producer is rolling out the next step whenever a checkpoint lands."""
    run = tmp_path / "run"
    staleness = ["--set", "rollout.max_staleness=1", "--set", "learner.old_logprobs=decoupled"]
    done = _kill_after_first_checkpoint(run, *staleness)
    trained = [r["step"] for r in _rows(run) if r["step"] > 0]
    assert done >= 1 and trained[-1] <= done + 1  # at most the step after the checkpoint was logged
    out = subprocess.run(
        _cli("--run-dir", str(run), "--resume", "--steps", str(done + 1), *staleness),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = _rows(run)
    # Every trained step is there once; the resumed run went on from the checkpoint, not from scratch.
    assert [r["step"] for r in rows] == [0, *range(1, done + 2)]
    assert rows[-1]["data/cursor"] == (done + 1) * 2
    # The in-flight batch was rolled out again with the checkpoint's weights: not stale at all.
    assert rows[-1]["rollout/staleness_max"] == 0.0
    assert list_checkpoints(run / "checkpoints")[-1].name == f"step-{done + 1:06d}"


def _ckpt(root: Path, step: int) -> Path:
    weights = {"w": torch.zeros(1024)}
    return save_checkpoint(root, step, policies={"p": weights}, learners={"p": {"m": torch.ones(8)}}, state={})


def test_a_disk_too_small_for_the_checkpoint_is_said_before_writing(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    _ckpt(root, 1)
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=100))
    with pytest.raises(OSError, match=r"checkpoint step 2 needs about .* GiB free; nothing was written"):
        _ckpt(root, 2)
    assert [p.name for p in root.iterdir()] == ["step-000001"]
    assert latest_checkpoint(root).name == "step-000001"


def test_a_failed_write_removes_its_partial_checkpoint_and_names_the_folder(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    _ckpt(root, 1)
    real_save = safetensors.torch.save_file

    def short_write(tensors, path, *a, **k):
        if Path(path).name.startswith("learner-"):  # the disk fills after the weights were written
            raise OSError(28, "No space left on device")
        return real_save(tensors, path, *a, **k)

    monkeypatch.setattr(safetensors.torch, "save_file", short_write)
    with pytest.raises(OSError, match=r"writing checkpoint step 2 to .*checkpoints failed .*earlier ones are intact"):
        _ckpt(root, 2)
    assert [p.name for p in root.iterdir()] == ["step-000001"]
