"""A placed run's local Ray listens on loopback only.

The smoke preset on a shared pool of two data-parallel ranks, started as `drmas-train --placement shared`
starts it (no `ray_address`: the run starts its own Ray). After one training step (rollout, the ranks'
gradient all-reduce, the engine sync) every listening TCP socket and every bound UDP socket of this
process and of all the processes it started (Ray's GCS, raylet and agents, the workers, whatever they
started) must be on a loopback address.
"""

import pytest

ray = pytest.importorskip("ray")
from sockets import bound_sockets, is_loopback  # noqa: E402

from drmas_train.config import build_config  # noqa: E402
from drmas_train.run.trainer import Trainer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def test_a_placed_run_with_its_own_ray_listens_on_loopback_only(tmp_path):
    assert not ray.is_initialized()
    overrides = {
        "log.run_dir": str(tmp_path / "run"),
        "steps": 1,
        "placement.mode": "shared",
        "placement.shared_pool.cpus": 1,
        "placement.shared_pool.ranks": 2,
    }
    trainer = Trainer(build_config("smoke", overrides))
    try:
        assert trainer.workers.own_ray  # the run started Ray itself
        trainer.train_step()
        sockets = bound_sockets()
    finally:
        trainer.close()
    assert not ray.is_initialized()  # the run stopped the Ray it started
    names = {name for _, name, *_ in sockets}
    assert {"gcs_server", "raylet"} <= names, sockets  # Ray's own servers were seen, so the list is real
    exposed = [s for s in sockets if not is_loopback(s[2])]
    assert exposed == [], exposed
