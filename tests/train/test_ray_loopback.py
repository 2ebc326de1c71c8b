"""A placed run's local Ray listens on loopback only.

The smoke preset on a shared pool of two data-parallel ranks, started as `drmas-train --placement shared`
starts it (no `ray_address`: the run starts its own Ray). After one training step (rollout, the ranks'
gradient all-reduce, the engine sync) every listening TCP socket and every bound UDP socket of this
process and of all the processes it started (Ray's GCS, raylet and agents, the workers, whatever they
started) must be on a loopback address.
"""

import ipaddress
import socket

import pytest

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

from drmas_train.config import build_config  # noqa: E402
from drmas_train.run.trainer import Trainer  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray]


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, an IPv6 socket bound to IPv4 loopback
    return (mapped or address).is_loopback


def _listening() -> list[tuple[str, str, int, str]]:
    """(process name, ip, port, kind) of every listening TCP and bound UDP socket of this process tree."""
    me = psutil.Process()
    found = []
    for proc in [me, *me.children(recursive=True)]:
        try:
            name, conns = proc.name(), proc.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for c in conns:
            tcp_listen = c.type == socket.SOCK_STREAM and c.status == psutil.CONN_LISTEN
            udp_bound = c.type == socket.SOCK_DGRAM and c.laddr
            if tcp_listen or udp_bound:
                found.append((name, c.laddr.ip, c.laddr.port, "tcp" if tcp_listen else "udp"))
    return found


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
        sockets = _listening()
    finally:
        trainer.close()
    assert not ray.is_initialized()  # the run stopped the Ray it started
    names = {name for name, *_ in sockets}
    assert {"gcs_server", "raylet"} <= names, sockets  # Ray's own servers were seen, so the list is real
    exposed = [s for s in sockets if not _is_loopback(s[1])]
    assert exposed == [], exposed
