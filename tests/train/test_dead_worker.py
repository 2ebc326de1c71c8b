"""A Ray worker killed mid-run: one line naming it and the step; `--resume` continues with nothing lost.

The smoke preset on the test's local CPU Ray, on a shared pool of two data-parallel ranks where only
rank 0 holds an engine (`placement.rollout_ranks: first`): rank 1 is a learner and nothing else,
rank 0 both engine and learner. One run lives three times, so the file starts five workers in all:

1. `drmas-train` in a subprocess, joined to the test's Ray; once checkpoint 1 exists the test kills
   rank 1's process with SIGKILL. Rank 0 waits for it in the gradient all-reduce, so the driver must
   not wait for rank 0: it exits with status 3 and one line naming rank 1 as the learner, the step of
   that update and the last complete checkpoint.
2. Resumed in-process (`Trainer(resume=True)`, what `--resume` runs) on one rank; after its first
   step the test kills that rank: the next step's rollout fails naming it as the engine. A save
   tried then, with no live worker, writes nothing.
3. `drmas-train --resume` finishes the run. Every step appears once in metrics.jsonl, and the rows
   of the steps each crash's checkpoint held are the ones written before the crash.

The vLLM engine actor beside a data-parallel rank (`placement.engines`) is covered with a stand-in
actor: vLLM cannot run the tests' tiny model.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from ray.util.placement_group import placement_group_table  # noqa: E402

from drmas_train.config import build_config  # noqa: E402
from drmas_train.placement.failures import WorkerDiedError  # noqa: E402
from drmas_train.placement.loopback import ONE_MACHINE_ENV, loopback_only  # noqa: E402
from drmas_train.run.checkpoint import latest_checkpoint  # noqa: E402
from drmas_train.run.trainer import Trainer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray]

# No validation and no TensorBoard: neither is what this test is about, both cost time.
QUIET = {"eval.every": 0, "eval.before_train": False, "log.tensorboard": False}
TWO_RANKS = {
    "placement.mode": "shared",
    "placement.shared_pool.cpus": 1,
    "placement.shared_pool.ranks": 2,
    "placement.rollout_ranks": "first",
}
ONE_RANK = {"placement.mode": "shared", "placement.shared_pool.cpus": 1, "placement.shared_pool.ranks": 1}


@pytest.fixture(scope="module")
def local_ray():
    with loopback_only():  # a local Ray on 127.0.0.1 only, as drmas-train starts it
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def _loopback_env() -> dict[str, str]:
    """The plain environment: drmas-train joins the test's Ray on 127.0.0.1 as given (`placement.start_ray`)."""
    return {k: v for k, v in os.environ.items() if k != ONE_MACHINE_ENV}


def _cli(run: Path, address: str, overrides: dict, *args: str) -> list[str]:
    sets = [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]
    return [sys.executable, "-m", "drmas_train", "--run-dir", str(run), "--ray-address", address, *sets, *args]


def _rows(run: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows]
    assert len(steps) == len(set(steps)), f"a step logged twice: {steps}"
    return {r["step"]: r for r in rows}


def _checkpoint(run: Path) -> int:
    return int(latest_checkpoint(run / "checkpoints").name.split("-")[1])


def _worker_pid(rank: int) -> int:
    """The pid of the live placed worker of pool 'shared' at `rank` (its Ray actor name says which)."""
    named = [
        a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(f"drmas:shared:rank{rank}:")
    ]
    alive = []
    for actor in named:
        try:
            alive.append(ray.get(ray.get_actor(actor["name"], namespace=actor["namespace"]).pid.remote(), timeout=30))
        except (ValueError, ray.exceptions.RayActorError):
            continue  # a worker of an earlier life, gone
    assert len(alive) == 1, named
    return alive[0]


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_a_killed_worker_ends_the_run_naming_it_and_resume_loses_nothing(local_ray, tmp_path):
    run = tmp_path / "run"
    # 1. The CLI, rank 1 (a learner only) killed once checkpoint 1 is on disk.
    argv = _cli(run, local_ray, {**QUIET, **TWO_RANKS}, "--preset", "smoke", "--steps", "30")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_loopback_env())
    try:
        deadline = time.monotonic() + 900  # generous: two Ray ranks start slowly on a loaded 2-core machine
        while latest_checkpoint(run / "checkpoints") is None:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint appeared"
            time.sleep(0.1)
        os.kill(_worker_pid(1), signal.SIGKILL)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, stderr[-3000:]
    assert "Traceback" not in stderr
    first = _checkpoint(run)
    (line,) = _error_lines(stderr)
    assert f"during step {first + 1}: pool 'shared' rank 1 (pid " in line
    # The kill lands while rank 1 waits in the step's update, or, when that update was already done, in the
    # step's last call (its memory peaks): the step is still unfinished either way.
    assert re.search(r"rank 1 \(pid \d+\)(, the learner of model 'shared', in update\(\)| in memory\(\));", line), line
    assert line.endswith(f"the last complete checkpoint is step {first}: continue with --resume")
    before = _rows(run)
    assert list(before) == list(range(1, first + 1))  # the failed step wrote no row
    assert all(v["state"] == "REMOVED" for v in placement_group_table().values())  # the CLI freed its pool

    # 2. Resumed in-process on one rank; that rank (engine and learner) killed after one step.
    cfg = build_config("smoke", {"log.run_dir": str(run), "steps": first + 3, **QUIET, **ONE_RANK})
    trainer = Trainer(cfg, resume=True)
    assert trainer.step == first

    def kill_rank_0(row):
        os.kill(_worker_pid(0), signal.SIGKILL)

    with pytest.raises(WorkerDiedError) as died:
        trainer.train(kill_rank_0)
    second = first + 1
    assert (died.value.step, died.value.checkpoint, died.value.role, died.value.call) == (
        second + 1,
        second,
        "engine",
        "generate",
    )
    assert "pool 'shared' rank 0 (pid " in str(died.value)
    assert not trainer.workers.handles and all(v["state"] == "REMOVED" for v in placement_group_table().values())
    # A save whose workers are gone fails before it writes: no folder, complete or not, appears.
    saved = sorted(p.name for p in (run / "checkpoints").iterdir())
    with pytest.raises(WorkerDiedError, match=r"in shard_bytes\(\)"):
        trainer.save()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == saved
    middle = _rows(run)
    assert list(middle) == list(range(1, second + 1))
    assert all(middle[s] == before[s] for s in before)

    # 3. --resume through the CLI finishes the run (its config.yaml: the one-rank pool of life 2).
    argv = _cli(run, local_ray, {}, "--resume")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=_loopback_env())
    assert out.returncode == 0, out.stderr[-3000:]
    after = _rows(run)
    assert list(after) == list(range(1, first + 4))
    assert all(after[s] == middle[s] for s in middle)
    assert after[first + 3]["data/cursor"] == (first + 3) * 2  # 2 prompts a step: no batch skipped or repeated
    assert _checkpoint(run) == first + 3


def test_a_dead_engine_actor_is_named_beside_its_worker(local_ray):
    # A data-parallel vLLM rank keeps its engine in an `EngineActor` beside it and calls it through
    # `ActorBackend`. vLLM cannot run the tiny model, so a stand-in actor answers the same `call`
    # (named as such); the worker's side is the real `ActorBackend`, the death a real SIGKILL.
    from drmas_train.placement.failures import gather

    class StandInEngine:  # a stand-in for EngineActor: same `call` entry point, no vLLM
        def call(self, method, *args, **kwargs):
            return [f"{method}:{len(args[0])}"]

        def pid(self):
            return os.getpid()

    class Rank:  # the worker's side: its engine reached through the real ActorBackend
        def __init__(self, engine):
            from drmas_train.placement.engines import ActorBackend

            self.backend = ActorBackend(engine, tokenizer=None)

        def generate(self, prompts):
            return self.backend.generate(prompts, [None] * len(prompts))

    engine = ray.remote(num_cpus=0)(StandInEngine).remote()
    rank = ray.remote(num_cpus=0)(Rank).remote(engine)
    label = ["pool 'solver' rank 0 (pid 1)"]
    assert gather([rank.generate.remote(["a", "b"])], label, "engine", "solver", "generate") == [["generate:2"]]
    os.kill(ray.get(engine.pid.remote()), signal.SIGKILL)
    with pytest.raises(WorkerDiedError) as died:
        gather([rank.generate.remote(["a"])], label, "learner", "solver", "update")
    assert str(died.value) == (
        "Ray worker died: the vLLM engine actor beside pool 'solver' rank 0 (pid 1), "
        "the engine of model 'solver', in update()"
    )
    # At a step the trainer adds the step and the checkpoint to the same error.
    assert str(died.value.at_step(4, 3)).startswith("Ray worker died during step 4: the vLLM engine actor beside")


def test_a_worker_whose_constructor_raises_keeps_its_own_message(local_ray):
    # Not a death: the user needs the constructor's error (a missing model file, say), as Ray reports it.
    from drmas_train.placement.failures import gather

    class Broken:
        def __init__(self):
            raise FileNotFoundError("no model at /nowhere")

        def pid(self):
            return os.getpid()

    broken = ray.remote(num_cpus=0)(Broken).remote()
    with pytest.raises(ray.exceptions.RayActorError, match="no model at /nowhere"):
        gather([broken.pid.remote()], ["pool 'p' rank 0"], "worker", "", "__init__")
