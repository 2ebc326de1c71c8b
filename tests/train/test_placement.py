"""Ray resource pools on local CPU Ray: shared and per_agent placements train like the single process.

The smoke preset with one model per agent (two models), 2 steps, 1 torch thread everywhere: the
per-model gradient norms of both placed runs must equal the single-process run's (tolerance 1e-5
relative; the same ops run on the same data in the same order, so they agree to the last bits here).
"""

import math

import pytest

ray = pytest.importorskip("ray")

from ray.util.placement_group import PlacementGroup  # noqa: E402

from drmas_train.config import build_config  # noqa: E402
from drmas_train.placement import PlacementConfig, PoolSize, attach, shutdown, worker_groups  # noqa: E402
from drmas_train.trainer import Trainer  # noqa: E402

pytestmark = pytest.mark.slow
KEYS = ("grad_norm/solver", "grad_norm/verifier", "reward/solver", "reward/verifier", "tokens/generated")


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _cfg(tmp_path, name):
    return build_config("smoke", {"log.run_dir": str(tmp_path / name), "models.assignment": "per_agent"})


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    return Trainer(_cfg(tmp_path_factory.mktemp("single"), "run")).train()


def test_worker_groups():
    assert worker_groups("per_agent", ["a", "b"]) == {"a": ["a"], "b": ["b"]}
    assert worker_groups("lora", ["a", "b"]) == {"lora": ["a", "b"]}
    with pytest.raises(ValueError):
        PlacementConfig(mode="everywhere")


@pytest.mark.parametrize(
    "placement",
    [
        PlacementConfig(mode="shared", shared_pool=PoolSize(cpus=2)),
        PlacementConfig(mode="per_agent", pools={"solver": PoolSize(cpus=1), "verifier": PoolSize(cpus=1)}),
    ],
    ids=["shared", "per_agent"],
)
def test_placed_training_matches_the_single_process(placement, single_process, local_ray, tmp_path):
    trainer = Trainer(_cfg(tmp_path, placement.mode))
    handles = attach(trainer, placement)
    try:
        rows = trainer.train()
        # where the workers ran: one pool, or one pool each
        pgs = {h.id for h in handles if isinstance(h, PlacementGroup)}
        assert len(pgs) == (1 if placement.mode == "shared" else 2)
        saved = trainer.policies["solver"].weights()  # checkpoints read the weights back from the worker
        assert saved and all(math.isfinite(float(t.abs().sum())) for t in saved.values())
    finally:
        shutdown(handles)
    assert [r["step"] for r in rows] == [1, 2]
    for got, ref in zip(rows, single_process):
        for key in KEYS:
            assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), key
    assert any(r["grad_norm/solver"] > 0 for r in rows)
