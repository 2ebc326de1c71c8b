"""A rollout pool beside the learner pools (`placement.rollout_pool`), on local CPU Ray with the smoke preset.

- k = 0, placement shared, assignment lora: the learner worker only trains; the base model with both
  agents' adapters lives in one engine actor, another process on another placement group; the run
  gives the single-process run's numbers (the engine samples with the pushed adapters, the same seeds
  and ops), every call of step t is stamped with version t - 1, and a killed engine actor ends the
  next step with the one-line error naming it.
- k = 1, placement per_agent, assignment per_agent: two learner pools and two engines on the rollout
  pool; the rollout of step 2 runs while step 1 updates (some of its calls carry version 0), never past
  the bound; the checkpoint resumes into a shared learner pool beside a new rollout pool of two
  replicas per model (each samples a share of every round), on the checkpoint's version.
- The config is checked before anything starts.
"""

import json
import os
import signal
from pathlib import Path

import pytest

from drmas_train.config import PlacementConfig, PoolSize, build_config, save_config
from drmas_train.placement.loopback import loopback_only
from drmas_train.placement.rollout_pool import ROLLOUT_POOL, check_worker_names, engine_groups
from drmas_train.run.trainer import Trainer

QUIET = {"log.tensorboard": False, "eval.before_train": False}
POOLED = {"placement.mode": "shared", "placement.shared_pool.cpus": 1, "placement.rollout_pool.cpus": 1}
KEYS = ("grad_norm/solver", "grad_norm/verifier", "reward/solver", "reward/verifier", "tokens/generated", "val/avg@2")


def _cfg(run_dir: Path, **overrides):
    return build_config("smoke", {"log.run_dir": str(run_dir), **QUIET, **overrides})


def _versions(run_dir: Path) -> dict[int, set[int]]:
    """Step -> the weight versions of its logged calls (trajectories.jsonl)."""
    out: dict[int, set[int]] = {}
    for line in (run_dir / "trajectories.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.setdefault(row["step"], set()).update(c["weight_version"] for c in row["calls"])
    return out


def test_rollout_pool_config_is_checked(tmp_path):
    cfg = build_config("smoke", POOLED)
    assert cfg.placement.rollout_pool == PoolSize(cpus=1.0)
    assert build_config("smoke").placement.rollout_pool is None  # engines live with their learners by default
    save_config(cfg, tmp_path / "config.yaml")
    assert build_config(str(tmp_path / "config.yaml")) == cfg  # what --resume reads back
    with pytest.raises(ValueError, match="rollout_pool needs placement.mode shared or per_agent"):
        build_config("smoke", {"placement.rollout_pool.cpus": 1})
    with pytest.raises(ValueError, match="'rollout_pool' needs cpus > 0"):
        PlacementConfig(mode="shared", rollout_pool=PoolSize(cpus=0))
    with pytest.raises(ValueError, match="rollout_pool.strategy must be replicate"):
        PlacementConfig(mode="per_agent", rollout_pool=PoolSize(ranks=2, strategy="fsdp"))
    with pytest.raises(ValueError, match="named 'rollout'"):
        check_worker_names(["solver", ROLLOUT_POOL])
    # One engine per model: LoRA adapters share their base's, whole models have one each.
    lora = {"lora": {a: {"agents": [a], "adapter": a, "path": "/m"} for a in ("solver", "verifier")}}
    assert [(g.policies, g.adapters) for g in engine_groups(lora)] == [(["solver", "verifier"], ["solver", "verifier"])]
    two = {"shared": {a: {"agents": [a], "adapter": None, "path": f"/{a}"} for a in ("solver", "verifier")}}
    assert [(g.worker, g.policies, g.path) for g in engine_groups(two)] == [
        ("shared", ["solver"], "/solver"),
        ("shared", ["verifier"], "/verifier"),
    ]


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    with loopback_only():  # a local Ray on 127.0.0.1 only, as drmas-train starts it
        ray.init(
            address="local", num_cpus=3, include_dashboard=False, log_to_driver=False
        )  # logical CPUs: the pools' sum
    yield ray
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.ray
def test_k0_lora_on_a_rollout_pool_trains_as_the_single_process_and_a_dead_engine_is_named(local_ray, tmp_path):
    from drmas_train.placement.failures import WorkerDiedError

    ray = local_ray
    lora = {"models.assignment": "lora"}  # one base, an adapter per agent: one engine serves both policies
    reference = Trainer(_cfg(tmp_path / "single", **lora)).train()
    run = tmp_path / "pooled"
    trainer = Trainer(_cfg(run, steps=3, **lora, **POOLED))
    solver, verifier = trainer.policies["solver"], trainer.policies["verifier"]
    (engine,) = solver.backend.workers  # the driver samples from the engine actor, not the learner worker
    learner, sampler = ray.get(solver.worker.where.remote()), ray.get(engine.where.remote())
    assert ray.get(verifier.backend.workers[0].where.remote()) == sampler
    assert learner["pid"] != sampler["pid"] and os.getpid() not in (learner["pid"], sampler["pid"])
    assert None not in (learner["placement_group"], sampler["placement_group"])
    assert learner["placement_group"] != sampler["placement_group"]
    assert solver.backend.labels == [f"pool 'rollout' rank 0 (pid {sampler['pid']})"]

    def kill_the_engine_after_step_2(row):
        if row["step"] == 2:
            assert ray.get(engine.generated.remote()) > 0 and ray.get(solver.worker.generated.remote()) == 0
            os.kill(sampler["pid"], signal.SIGKILL)

    with pytest.raises(WorkerDiedError) as died:
        trainer.train(kill_the_engine_after_step_2)
    assert str(died.value) == (
        f"Ray worker died during step 3: pool 'rollout' rank 0 (pid {sampler['pid']}), the engine of model "
        "'solver', in generate(); the last complete checkpoint is step 2: continue with --resume"
    )
    assert not trainer.workers.handles  # the run freed its actors and pools
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert "val/avg@2" in rows[1] and "val/avg@2" in reference[1]
    # Each model trained on some step (a step whose rewards are all equal has gradient 0), so the
    # comparison below is of real updates.
    assert all(any(r[f"grad_norm/{m}"] > 0 for r in rows) for m in ("solver", "verifier")), rows
    for got, ref in zip(rows, reference):
        for key in (k for k in KEYS if k in ref):
            assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), key
        assert got["rollout/staleness_max"] == 0.0
    assert rows[1]["val/weight_version"] == 2.0  # validation sampled on the rollout pool after the push
    assert _versions(run) == {1: {0}, 2: {1}}  # the engine stamped the version it was pushed


@pytest.mark.slow
@pytest.mark.ray
def test_k1_per_agent_learner_pools_overlap_the_rollout_pool_and_resume(local_ray, tmp_path):
    ray = local_ray
    async_ = {"rollout.max_staleness": 1, "learner.old_logprobs": "decoupled", "models.assignment": "per_agent"}
    pools = {"placement.mode": "per_agent", "placement.default_pool.cpus": 1, "placement.rollout_pool.cpus": 1}
    run = tmp_path / "run"
    trainer = Trainer(_cfg(run, steps=2, **async_, **pools))
    where = {n: ray.get(p.backend.workers[0].where.remote())["placement_group"] for n, p in trainer.policies.items()}
    learners = {n: ray.get(p.worker.where.remote())["placement_group"] for n, p in trainer.policies.items()}
    assert where["solver"] == where["verifier"]  # both engines on the one rollout pool
    assert len({*learners.values(), where["solver"]}) == 3  # beside two learner pools of their own
    rows = trainer.train()
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["rollout/staleness_max"] <= 1.0 and "rollout/dropped_groups" not in row
    versions = _versions(run)
    assert versions[1] == {0}
    # Step 2's rollout started as soon as step 1's batch was out, while its learners updated: its first
    # round was sampled before the pushes of version 1 (an update takes far longer than a dispatch).
    assert versions[2] <= {0, 1} and 0 in versions[2]
    # Resumed into one learner pool (both models' learners) beside a new rollout pool of two replicas per
    # model, each sampling a share of every round: all on version 2, the checkpoint's.
    replicas = {"placement.rollout_pool.cpus": 0.5, "placement.rollout_pool.ranks": 2}
    resumed = Trainer(_cfg(run, steps=3, **{**async_, **POOLED, **replicas}), resume=True)
    assert resumed.step == 2 and all(len(p.backend.workers) == 2 for p in resumed.policies.values())
    engines = [e for p in resumed.policies.values() for e in p.backend.workers]
    shares: list[int] = []
    row = resumed.train(lambda _row: shares.extend(ray.get([e.generated.remote() for e in engines])))[-1]
    assert row["step"] == 3 and row["rollout/staleness_max"] == 0.0
    assert len(shares) == 4 and all(n > 0 for n in shares)  # every replica sampled its share
    assert _versions(run)[3] == {2}
