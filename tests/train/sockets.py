"""The sockets a test's process tree listens on (the Ray loopback tests)."""

from __future__ import annotations

import ipaddress
import socket

import psutil


def is_loopback(ip: str) -> bool:
    """Whether a bound address is loopback (::ffff:127.0.0.1, an IPv6 socket bound to IPv4 loopback, too)."""
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def bound_sockets() -> set[tuple[int, str, str, int]]:
    """(pid, process name, ip, port) of every listening TCP and bound UDP socket of this process and of
    every process it started."""
    me = psutil.Process()
    found = set()
    for proc in [me, *me.children(recursive=True)]:
        try:
            name, conns = proc.name(), proc.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for c in conns:
            tcp_listen = c.type == socket.SOCK_STREAM and c.status == psutil.CONN_LISTEN
            if tcp_listen or (c.type == socket.SOCK_DGRAM and c.laddr):
                found.add((proc.pid, name, c.laddr.ip, c.laddr.port))
    return found
