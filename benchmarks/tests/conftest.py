"""The benchmarks' tests run under the suite's rules (tests/conftest.py, which covers tests/ only).

On a pytest-xdist worker each process computes on one thread; tests marked `ray` go to the worker that
runs the Ray tests one after another, and tests marked `vllm` (without Ray) to the one that runs those.
The rules are repeated here rather than imported: tests/ is not a package, and neither conftest edits the import path.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # before any test module imports torch, which reads it once
    os.environ["OMP_NUM_THREADS"] = "1"

ENGINE_GROUP = "engines"  # the group names of tests/conftest.py
VLLM_GROUP = "vllm"
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if not item.path.is_relative_to(HERE) or item.get_closest_marker("xdist_group"):
            continue  # not ours, or already grouped (by tests/conftest.py when both folders run)
        if item.get_closest_marker("ray"):
            item.add_marker(pytest.mark.xdist_group(ENGINE_GROUP))
        elif item.get_closest_marker("vllm"):
            item.add_marker(pytest.mark.xdist_group(VLLM_GROUP))
