"""Suite-wide: how the suite runs on two workers (`make test`), and one torch thread per worker.

`make test` runs `pytest -n 2 --dist loadgroup` (pytest-xdist). Every test may run beside any other,
except those marked `xdist_group(name)`, which run one after another on one worker (a module whose
fixture is expensive to build, or tests that must not compile at the same time). Tests that start
engines, Ray or subprocesses (markers `slow`, `ray`, `vllm`) are handed out first, so that the quick
tests fill the end of the run rather than one long test running alone on one core while the other idles.

pytest-xdist 3.8 groups by appending `@name` to a test's node id, which pytest 9.2 no longer takes
(pytest-dev/pytest-xdist#1386): grouping then silently stops. `scripts/setup.sh` installs a pytest
before 9.2, and a worker whose grouped tests lost their group refuses to run (`_check_groups`).

Each worker's torch (and every process it starts) computes on one thread: two workers with two threads
each would put four busy threads on two cores, and OpenMP's spinning threads slow down badly when they
share a core. The models here are tiny: a second thread buys little.
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # before any test module imports torch, which reads it once
    os.environ["OMP_NUM_THREADS"] = "1"

HEAVY = ("slow", "ray", "vllm")
"""Markers of tests handed out first."""


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one intra-op thread for a module: tiny models gain nothing from more, and lose a lot to
    them on a busy 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def heavy_first(items: list[pytest.Item]) -> None:
    """Reorder `items` in place: tests with a `HEAVY` marker first, each part in collection order."""
    items.sort(key=lambda item: not any(item.get_closest_marker(m) for m in HEAVY))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    heavy_first(items)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    _check_groups(session.config, session.items)


def _check_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup`, fail the worker if a test marked `xdist_group` lost its group."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist workers only
        return
    lost = [item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist did not group {lost[0]} (and {len(lost) - 1} more): this pytest no longer takes "
            "xdist's group suffix (pytest-dev/pytest-xdist#1386); install pytest<9.2 (scripts/setup.sh)"
        )
