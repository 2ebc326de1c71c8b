"""`log.wandb`: a smoke run logs to Weights & Biases in offline mode (no network), and a resume continues it."""

import pytest
import wandb

from drmas_train.config import build_config
from drmas_train.run.trainer import Trainer


@pytest.fixture
def offline_wandb(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))


def test_a_smoke_run_logs_to_wandb_offline_and_a_resume_continues_it(tmp_path, offline_wandb):
    run = tmp_path / "run"
    overrides = {"log.run_dir": str(run), "log.wandb": True, "steps": 1, "eval.every": 0, "eval.before_train": False}
    trainer = Trainer(build_config("smoke", overrides))
    trainer.train()
    trainer.close()
    # What a process's exit does (wandb's atexit hook): wait until W&B's service has written everything;
    # `finish` alone may return before its writer flushes the file on a busy machine.
    wandb.teardown()
    run_id = (run / "wandb_id.txt").read_text().strip()
    (log,) = list((run / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))  # what `wandb sync` uploads
    events = log.read_bytes()
    assert b"reward/team" in events and b"grad_norm/shared" in events  # the step's metrics (protobuf strings)
    assert b"wandb_project" in events  # the run's config
    trainer = Trainer(build_config("smoke", {**overrides, "steps": 2}), resume=True)
    trainer.train()
    trainer.close()
    assert (run / "wandb_id.txt").read_text().strip() == run_id  # the same W&B run
    assert len(list((run / "wandb").glob(f"offline-run-*-{run_id}"))) == 2  # the first run and its resume
