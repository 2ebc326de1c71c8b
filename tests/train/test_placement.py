"""Ray resource pools on local CPU Ray: shared and per_agent placements train like the single process.

The smoke preset with one model per agent (two models), 2 steps, 1 torch thread everywhere: the
per-model gradient norms of both placed runs must equal the single-process run's (tolerance 1e-5
relative; the same ops run on the same data in the same order, so they agree to the last bits here).
Step 1 runs `--placement shared` through the real CLI in a subprocess that joins the test's local Ray
with `--ray-address`; step 2 resumes that checkpoint in-process with `placement.mode: per_agent`
(fresh workers, one pool per model). Chaining the two keeps the file to three Ray workers (each
costs 5-10 s here, mostly importing torch and transformers in the actor). A third run trains both
models data-parallel on a shared pool of two ranks and must give the same numbers; both ranks generate,
and their first rollout must record exactly one engine's ids.
"""

import json
import math
import subprocess
import sys

import pytest

ray = pytest.importorskip("ray")

from ray.util.placement_group import PlacementGroup, placement_group_table  # noqa: E402

from drmas_train.config import build_config  # noqa: E402
from drmas_train.placement import PlacementConfig, PoolSize, worker_groups  # noqa: E402
from drmas_train.placement.loopback import loopback_only  # noqa: E402
from drmas_train.placement.pools import generates, uses_engine_actors  # noqa: E402
from drmas_train.placement.proxies import split_rows  # noqa: E402
from drmas_train.rollout import rollout  # noqa: E402
from drmas_train.run.checkpoint import latest_checkpoint, load_checkpoint  # noqa: E402
from drmas_train.run.trainer import Trainer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray]
KEYS = ("grad_norm/solver", "grad_norm/verifier", "reward/solver", "reward/verifier", "tokens/generated")


@pytest.fixture(scope="module")
def local_ray():
    with loopback_only():  # a local Ray on 127.0.0.1 only, as drmas-train starts it
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _cfg(run_dir, **overrides):
    return build_config("smoke", {"log.run_dir": str(run_dir), "models.assignment": "per_agent", **overrides})


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    return Trainer(_cfg(tmp_path_factory.mktemp("single") / "run")).train()


@pytest.fixture(scope="module")
def one_engine_rollout(tmp_path_factory):
    trainer = Trainer(_cfg(tmp_path_factory.mktemp("local") / "run", steps=1))
    try:
        return _first_rollout(trainer)
    finally:
        trainer.close()


def _assert_same_numbers(rows, reference):
    assert [r["step"] for r in rows] == [1, 2]
    for got, ref in zip(rows, reference):
        for key in KEYS:
            assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), key
    assert any(r["grad_norm/solver"] > 0 for r in rows)


def _removed(pg_ids):
    """Whether Ray has removed these placement groups (ids in hex)."""
    table = placement_group_table()
    return all(table[i]["state"] == "REMOVED" for i in pg_ids)


def test_split_rows_gives_each_rank_a_contiguous_near_equal_share():
    shares = split_rows(7, 3)
    assert [(s.start, s.stop) for s in shares] == [(0, 3), (3, 5), (5, 7)]
    assert [(s.start, s.stop) for s in split_rows(1, 2)] == [(0, 1), (1, 1)]  # an empty share is skipped
    assert [i for s in split_rows(16, 4) for i in range(16)[s]] == list(range(16))


def _first_rollout(trainer):
    """A rollout of the first step's tasks at the first step's seed, outside the training loop."""
    tasks = [int(trainer.task_order(trainer.cfg.seed)[i]) for i in range(trainer.cfg.rollout.prompts_per_step)]
    batch = rollout(
        trainer.envs, tasks, trainer.cfg.rollout.group_size, trainer.serving, trainer.sampling, seed=trainer.cfg.seed
    )
    return [(r.agent, r.prompt_ids, r.response_ids) for r in batch.records]


def test_worker_groups_and_bad_placements(local_ray, tmp_path):
    assert worker_groups("per_agent", ["a", "b"]) == {"a": ["a"], "b": ["b"]}
    assert worker_groups("lora", ["a", "b"]) == {"lora": ["a", "b"]}
    # The generating ranks of a data-parallel vLLM pool move their engines into actors of their own.
    assert uses_engine_actors("vllm", ranks=2, rank=0) and uses_engine_actors("vllm", ranks=2, rank=1)
    assert not uses_engine_actors("vllm", ranks=2, rank=1, rollout_ranks="first")
    assert not uses_engine_actors("vllm", ranks=1, rank=0)
    assert not uses_engine_actors("transformers", ranks=2, rank=0)
    assert generates(0, "first") and not generates(1, "first") and generates(3, "all")
    with pytest.raises(ValueError, match="placement.mode"):
        PlacementConfig(mode="everywhere")
    with pytest.raises(ValueError, match="rollout_ranks"):
        PlacementConfig(rollout_ranks="some")
    with pytest.raises(ValueError, match="strategy must be one of"):
        PlacementConfig(shared_pool=PoolSize(ranks=2, strategy="zero3"))
    with pytest.raises(ValueError, match="ranks >= 1"):
        PlacementConfig(pools={"solver": PoolSize(ranks=0)})
    with pytest.raises(ValueError, match="unknown workers"):
        Trainer(_cfg(tmp_path / "a", **{"placement.mode": "per_agent", "placement.pools.nobody.cpus": 1}))
    # A pool the cluster cannot grant fails with a clear error, and the trainer frees what it made.
    overrides = {"placement.mode": "shared", "placement.shared_pool.cpus": 64, "placement.ready_timeout_s": 0.5}
    before = set(placement_group_table())
    with pytest.raises(TimeoutError, match="did not grant the pools"):
        Trainer(_cfg(tmp_path / "b", **overrides))
    made = {k for k, v in placement_group_table().items() if k not in before and v["bundles"][0]["CPU"] == 64}
    assert len(made) == 1 and _removed(made)


def test_shared_via_the_cli_then_resumed_per_agent_matches_the_single_process(single_process, local_ray, tmp_path):
    run = tmp_path / "run"
    # Step 1: the real CLI in a subprocess: one worker holding both models, on one pool of the test's Ray.
    argv = ["--preset", "smoke", "--assignment", "per_agent", "--steps", "1", "--run-dir", str(run)]
    argv += ["--placement", "shared", "--ray-address", local_ray, "--set", "placement.shared_pool.cpus=2"]
    argv += ["--set", "log.tensorboard=false"]  # saves importing TensorBoard in the subprocess
    out = subprocess.run([sys.executable, "-m", "drmas_train", *argv], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "mode: shared" in (run / "config.yaml").read_text()
    assert _removed(placement_group_table())  # every pool so far freed, the CLI's included

    # Step 2: resume that checkpoint into fresh per_agent workers (weights and optimizer states go from
    # the checkpoint to the workers), one pool per model.
    pools = {"placement.mode": "per_agent", "placement.pools.solver.cpus": 1, "placement.pools.verifier.cpus": 1}
    trainer = Trainer(_cfg(run, steps=2, **pools), resume=True)
    assert trainer.step == 1
    assert all(not hasattr(p, "module") for p in trainer.policies.values())  # no model was loaded here
    pg_ids = {h.id.hex() for h in trainer.workers.handles if isinstance(h, PlacementGroup)}
    assert len(pg_ids) == 2
    trainer.train()
    assert not trainer.workers.handles and _removed(pg_ids)  # train() freed the workers and pools

    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0 and "val/avg@2" in rows[0]  # the validation before training, made once
    _assert_same_numbers(rows[1:], single_process)
    ckpt = load_checkpoint(latest_checkpoint(run / "checkpoints"))  # fetched from the workers
    assert ckpt["state"]["step"] == 2 and set(ckpt["weights"]) == set(ckpt["learners"]) == {"solver", "verifier"}
    assert all(math.isfinite(float(t.abs().sum())) for t in ckpt["weights"]["solver"].values())


@pytest.mark.parametrize("strategy", ["replicate", "fsdp"])
def test_data_parallel_pool_matches_the_single_process(
    single_process, one_engine_rollout, local_ray, tmp_path, strategy
):
    # One shared pool of 2 ranks holding both models: each model trains data-parallel over the two
    # workers (gloo), the solver's two micro-batches split between them; the numbers must not move.
    # fsdp: the weights are sharded, rank 0 generates with its own whole copy synced after each update.
    pool = {"placement.mode": "shared", "placement.shared_pool.cpus": 1, "placement.shared_pool.ranks": 2}
    trainer = Trainer(_cfg(tmp_path / "dp", steps=1, **pool, **{"placement.shared_pool.strategy": strategy}))
    assert [len(p.ranks) for p in trainer.policies.values()] == [2, 2]
    # Every rank generates its share of a round; per-row seeds make the ids one engine's.
    assert _first_rollout(trainer) == one_engine_rollout
    for policy in trainer.policies.values():
        assert len(policy.backend.workers) == 2
        assert all(n > 0 for n in ray.get([w.generated.remote() for w in policy.ranks])), policy.name
    rows = trainer.train()
    # Each rank of the pool reports its own memory peaks every step (no GPU here: RSS only).
    assert all(rows[0][f"mem/shared/{rank}/peak_rss_mb"] > 0 for rank in (0, 1))
    assert not [k for k in rows[0] if k.startswith("mem/") and k.endswith("peak_device_gib")]
    # Resume the checkpoint (rank 0's weights and optimizer state, or each fsdp rank's own shards) into fresh
    # ranks for step 2: the engine and both replicas or shards must start from it.
    trainer = Trainer(
        _cfg(tmp_path / "dp", steps=2, **pool, **{"placement.shared_pool.strategy": strategy}), resume=True
    )
    assert trainer.step == 1
    rows += trainer.train()
    _assert_same_numbers(rows, single_process)
    # Step 2's validation samples on both ranks' engines, after the update: the new weights reached each.
    val = [k for k in single_process[-1] if k.startswith("val/")]
    assert val and all(rows[-1][k] == pytest.approx(single_process[-1][k], abs=1e-9) for k in val)
    # More solver calls than one micro-batch (8) holds, so rank 1 really computed part of the gradient.
    assert all(s["learner/solver/n_samples"] > 8 for s in single_process)
    assert all(r["learner/solver/n_tokens"] == s["learner/solver/n_tokens"] for r, s in zip(rows, single_process))


def test_sleeping_engines_on_a_sharded_pool_train_as_the_single_process(single_process, local_ray, tmp_path):
    # models.engine.sleep on an FSDP pool: each rank's engine holds a copy of its own, freed between
    # generations (every parameter on the meta device) and woken before each with the shards gathered
    # by every rank at once. Were a wake's push missing or wrong, the samples and so the numbers would move.
    from drmas_train.engines.sleep import SleepingEngine, resident_bytes

    def asleep(worker):
        return [
            isinstance(p.backend, SleepingEngine) and p.backend.asleep and resident_bytes(p.backend.inner.model) == 0
            for p in worker.policies.values()
        ]

    pool = {"placement.mode": "shared", "placement.shared_pool.cpus": 1, "placement.shared_pool.ranks": 2}
    sleeping = {"placement.shared_pool.strategy": "fsdp", "models.engine.sleep": True}
    trainer = Trainer(_cfg(tmp_path / "sleep", **pool, **sleeping))
    ranks = next(iter(trainer.policies.values())).ranks
    assert ray.get([w.__ray_call__.remote(asleep) for w in ranks]) == [[True, True]] * 2
    rows = trainer.train()
    _assert_same_numbers(rows, single_process)
    val = [k for k in single_process[-1] if k.startswith("val/")]
    assert val and all(rows[-1][k] == pytest.approx(single_process[-1][k], abs=1e-9) for k in val)


def test_resident_engines_share_an_actor_and_one_that_sleeps_closes_it(local_ray, monkeypatch):
    """A rank's vLLM engines: resident ones join one actor; vLLM's sleep pool is one per process, so an
    engine that sleeps is the last in its actor. vLLM sleeps on GPUs only, so stand-in engines (named
    as such) say whether they sleep; the placement is the real `move_vllm_engines_to_actors`."""
    import os
    from types import SimpleNamespace

    from drmas_train.placement import engines

    class StandInEngineActor:  # a stand-in for EngineActor: its engine sleeps iff its path says so
        def __init__(self, models_cfg, path, lora_rank):
            self.hosted = [path]

        def host(self, models_cfg, path, lora_rank):
            self.hosted.append(path)
            return len(self.hosted) - 1

        def sleep_state(self, engine=0):
            return (None if self.hosted[engine].startswith("sleeps") else "resident", False)

        def where(self):
            return {"pid": os.getpid()}

    monkeypatch.setattr(engines, "EngineActor", StandInEngineActor)
    paths = ["resident-a", "resident-b", "sleeps-c", "resident-d", "sleeps-e", "sleeps-f"]
    policies = {p: SimpleNamespace(module=object(), path=p, adapter=None, tokenizer=None) for p in paths}
    policies["shares-a"] = SimpleNamespace(module=policies["resident-a"].module, path="resident-a", adapter=None)
    engines.move_vllm_engines_to_actors(policies, None, {}, gpus=0.0)

    pid = {name: p.backend.pid() for name, p in policies.items()}
    actors = [{n for n in pid if pid[n] == v} for v in dict.fromkeys(pid.values())]
    assert actors == [{"resident-a", "shares-a", "resident-b", "sleeps-c"}, {"resident-d", "sleeps-e"}, {"sleeps-f"}]
    assert [policies[p].backend.engine for p in paths] == [0, 1, 2, 0, 1, 0]
    assert policies["shares-a"].backend is policies["resident-a"].backend
