"""Small copies of the paper's datasets in the layout the hub serves them (`drmas_envs.testing` makes the
rows), and the skip marker of the tests that need pyarrow."""

import importlib.util

import pytest

from drmas_envs.testing import (  # noqa: F401  (re-exported for the tests)
    SEARCH_SOURCES,
    aime24_rows,
    aime25_rows,
    math500_rows,
    plain_rows,
    search_rows,
    write_math_hub_layout,
    write_rows,
)

HAS_PYARROW = importlib.util.find_spec("pyarrow") is not None
needs_pyarrow = pytest.mark.skipif(not HAS_PYARROW, reason="pyarrow (optional: drmas-envs[data]) is not installed")
