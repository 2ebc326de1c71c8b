"""`drmas-train --ray-address` on a Ray cluster of two nodes, both on 127.0.0.1, on this one machine.

Ray's own cluster utilities (`ray.cluster_utils.Cluster`) start a head node and a second node, each a
raylet of 1 CPU and 100 MB of object store, both with `node_ip_address="127.0.0.1"`, so their GCS,
raylets, agents and workers bind to loopback. The smoke preset then runs through the real CLI, as a
driver of its own: on a shared pool of 2 data-parallel ranks of 1 CPU each, and on per-agent pools (one
model per agent, a pool of 1 CPU each). With 1 CPU per node each pool's ranks can only land one per node.
Each trains 2 steps with a checkpoint after each, then `--resume` trains step 3 from the checkpoint.

What it took to stay on loopback: a driver given a loopback address (`127.0.0.1:PORT`) does not dial it.
On Linux Ray rewrites "localhost", 127.0.0.1 and ::1 in a bootstrap address to the machine's own
interface address ("remotely reachable"), where nothing listens when the GCS is bound to 127.0.0.1, so
the driver waits for the GCS until it times out. Ray's one-machine mode (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`,
`drmas_train.placement.loopback`) turns that rewrite off: `drmas-train` joins a loopback address inside
it (`placement.start_ray`), so the driver connects to 127.0.0.1:PORT and finds its local raylet with
nothing set by hand (the subprocess here gets the plain environment). The nodes themselves need nothing
but `node_ip_address`.

While each run trains, the test lists every listening TCP socket and every bound UDP socket of the
cluster's processes (GCS, raylets, agents, the workers) and of the driver, and finds loopback only.
"""

import json
import os
import subprocess
import sys

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from sockets import bound_sockets, is_loopback  # noqa: E402

from drmas_train.placement.loopback import ONE_MACHINE_ENV  # noqa: E402
from drmas_train.run.checkpoint import latest_checkpoint  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray]

NODE = {"node_ip_address": "127.0.0.1", "num_cpus": 1, "object_store_memory": 100 * 1024**2}
SMALL = ["--preset", "smoke", "--set", "eval.every=0", "--set", "eval.before_train=false"]
SMALL += ["--set", "log.tensorboard=false", "--set", "log.checkpoint_every=1"]
DATA_PARALLEL = ["--placement", "shared", "--set", "placement.shared_pool.ranks=2"]
DATA_PARALLEL += ["--set", "placement.shared_pool.cpus=1"]


@pytest.fixture(scope="module")
def two_nodes():
    cluster = Cluster(initialize_head=True, head_node_args={**NODE, "include_dashboard": False})
    try:
        cluster.add_node(**NODE)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()  # this cluster's processes only, never `ray stop`


def _drmas_train(cluster, run_dir, log, *argv):
    """Run the CLI against the cluster as a driver of its own; return its exit status, its stderr's tail and
    the sockets seen while it ran."""
    env = {k: v for k, v in os.environ.items() if k != ONE_MACHINE_ENV}  # drmas-train keeps 127.0.0.1 itself
    cmd = [sys.executable, "-m", "drmas_train", *SMALL, "--ray-address", cluster.address, "--run-dir", str(run_dir)]
    seen = set()
    with open(log, "w") as err:
        proc = subprocess.Popen([*cmd, *argv], stdout=subprocess.DEVNULL, stderr=err, env=env)
        try:
            while True:
                seen |= bound_sockets()
                try:
                    proc.wait(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    continue
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return proc.returncode, log.read_text()[-3000:], seen


def _steps(run_dir):
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _checkpointed(run_dir):
    """The step of the run's latest checkpoint (a folder `step-<N>`)."""
    return int(latest_checkpoint(run_dir / "checkpoints").name.rsplit("-", 1)[1])


def _workers(cluster, names):
    """The run's workers, from the cluster's actor table (dead ones included): name -> (node id, pid)."""
    table = cluster.global_state.actor_table(None).values()
    return {a["Name"]: (a["Address"]["NodeID"], a["Pid"]) for a in table if a["Name"] in names}


@pytest.mark.parametrize(
    "placement, pools",
    [(DATA_PARALLEL, 1), (["--placement", "per_agent", "--assignment", "per_agent"], 2)],
    ids=["data-parallel", "per-agent"],  # per-agent: one pool of 1 CPU per agent's model
)
def test_two_loopback_nodes_train_checkpoint_and_resume(two_nodes, tmp_path, placement, pools):
    nodes = {n.node_id for n in two_nodes.list_all_nodes()}
    assert len(nodes) == 2
    before = {a["Name"] for a in two_nodes.global_state.actor_table(None).values()}
    run = tmp_path / "run"

    rc, err, seen = _drmas_train(two_nodes, run, tmp_path / "train.log", *placement, "--steps", "2")
    assert rc == 0, err
    assert _steps(run) == [1, 2]
    assert _checkpointed(run) == 2
    rc, err, seen_resumed = _drmas_train(
        two_nodes, run, tmp_path / "resume.log", *placement, "--steps", "3", "--resume"
    )
    assert rc == 0, err
    assert _steps(run) == [1, 2, 3]  # step 3 followed the checkpoint; a fresh start would log 1, 2 again
    assert _checkpointed(run) == 3

    # Two runs, each of two workers (two ranks of one pool, or one per agent's pool), one on each node.
    new = {a["Name"] for a in two_nodes.global_state.actor_table(None).values()} - before
    workers = _workers(two_nodes, {n for n in new if n.startswith("drmas:")})
    runs = {}
    for name, (node, _) in workers.items():
        runs.setdefault(name.rsplit(":", 1)[1], []).append((name.split(":")[1], node))
    assert len(runs) == 2, workers
    for placed in runs.values():
        assert len({pool for pool, _ in placed}) == pools and len(placed) == 2, placed
        assert {node for _, node in placed} == nodes, placed

    sockets = seen | seen_resumed
    names = {name for _, name, *_ in sockets}
    assert {"gcs_server", "raylet"} <= names, sockets  # Ray's own servers were seen, so the list is real
    assert {pid for _, pid in workers.values()} <= {pid for pid, *_ in sockets}, sockets  # and every worker's
    exposed = [s for s in sockets if not is_loopback(s[2])]
    assert exposed == [], exposed
