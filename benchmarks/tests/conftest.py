"""The benchmarks' tests run under the suite's rules (tests/conftest.py, which covers tests/ only):
one torch thread per pytest-xdist worker. Their order among the suite's tests is set there.
"""

from __future__ import annotations

import os

if os.environ.get("PYTEST_XDIST_WORKER"):  # before any test module imports torch, which reads it once
    os.environ["OMP_NUM_THREADS"] = "1"
