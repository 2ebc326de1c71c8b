"""Sharded checkpoints: each FSDP rank writes its own safetensors shard, and a resume onto another rank count
(2 -> 1, 1 -> 2) trains the next step as the uninterrupted run does.

The smoke preset's one shared model on a pool of 2 FSDP ranks of 1 CPU each (local Ray), or in this process.
The losses and numbers of the step after a resume must equal the uninterrupted single process's (1e-5
relative, as for the placed runs of `test_placement.py`: FSDP sums the same gradients in another order).
"""

import json

import pytest
import torch

ray = pytest.importorskip("ray")

from drmas_train.config import build_config  # noqa: E402
from drmas_train.placement.loopback import loopback_only  # noqa: E402
from drmas_train.run.checkpoint import latest_checkpoint, load_checkpoint, load_model_weights  # noqa: E402
from drmas_train.run.trainer import Trainer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray]
KEYS = ("learner/shared/loss", "learner/shared/pg_loss", "grad_norm/shared", "reward/mean", "tokens/generated")
FSDP = {
    "placement.mode": "shared",
    "placement.shared_pool.cpus": 1,
    "placement.shared_pool.ranks": 2,
    "placement.shared_pool.strategy": "fsdp",
}


@pytest.fixture(scope="module")
def local_ray():
    with loopback_only():  # a local Ray on 127.0.0.1 only, as drmas-train starts it
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _cfg(run_dir, steps, **overrides):
    return build_config(
        "smoke",
        {"log.run_dir": str(run_dir), "models.assignment": "shared", "steps": steps, "log.tensorboard": False}
        | overrides,
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return Trainer(_cfg(tmp_path_factory.mktemp("ref") / "run", 2)).train()


def _same_step(row, ref):
    assert row["step"] == ref["step"] == 2
    for key in KEYS:
        assert row[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6), key
    assert row["grad_norm/shared"] > 0


def test_two_fsdp_ranks_write_their_own_shards_and_resume_on_one(local_ray, uninterrupted, tmp_path):
    run = tmp_path / "run"
    Trainer(_cfg(run, 1, **FSDP)).train()
    folder = latest_checkpoint(run / "checkpoints")
    names = sorted(p.name for p in folder.iterdir())
    assert [n for n in names if n.endswith(".safetensors")] == [
        f"{kind}-shared.rank-{r:05d}.safetensors" for kind in ("learner", "weights") for r in (0, 1)
    ]
    assert not [n for n in names if n.endswith((".pt", ".pkl", ".bin"))]
    # Each rank holds about half of every weight matrix, cut along dim 0 at its own offset.
    idx = [json.loads((folder / f"weights-shared.rank-{r:05d}.json").read_text())["tensors"] for r in (0, 1)]
    cut = [k for k, e in idx[0].items() if "dim" in e and e["shape"][0] > 1]
    assert cut and all(idx[1][k]["offset"] == -(-idx[0][k]["shape"][0] // 2) for k in cut)
    # The one reader of weights alone gives them whole, as the optimizer's moments read whole are.
    whole = load_model_weights(folder)["shared"]
    moments = load_checkpoint(folder)["learners"]["shared"]["optimizer"]["state"]
    assert all(list(whole[k].shape) == idx[0][k]["shape"] for k in cut)
    assert any(v["exp_avg"].abs().sum() > 0 for v in moments.values())

    resumed = Trainer(_cfg(run, 2), resume=True)  # one process reads both ranks' slices
    assert resumed.step == 1
    _same_step(resumed.train()[-1], uninterrupted[-1])


def test_one_process_checkpoint_resumes_onto_two_fsdp_ranks(local_ray, uninterrupted, tmp_path):
    run = tmp_path / "run"
    Trainer(_cfg(run, 1)).train()
    assert json.loads((latest_checkpoint(run / "checkpoints") / "index.json").read_text())["policies"] == {
        "shared": [0]
    }
    resumed = Trainer(_cfg(run, 2, **FSDP), resume=True)  # each rank reads only its own rows of each tensor
    assert resumed.step == 1
    _same_step(resumed.train()[-1], uninterrupted[-1])
    folder = latest_checkpoint(run / "checkpoints")
    assert json.loads((folder / "index.json").read_text())["policies"] == {"shared": [0, 1]}
    assert all(torch.isfinite(t).all() for t in load_model_weights(folder)["shared"].values())
