"""The suite's own rules (tests/conftest.py), checked on a throwaway suite run the way `make test` runs it:
grouped tests share one worker, and tests that start engines are handed out first."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")
TESTS = """
import pytest

def test_a(): pass

@pytest.mark.xdist_group("g")
def test_b(): pass

@pytest.mark.xdist_group("g")
def test_c(): pass

def test_d(): pass

@pytest.mark.slow
def test_z(): pass
"""


def _run(tmp_path: Path, *args: str) -> str:
    """The output of pytest run with `args` on the throwaway suite."""
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_x.py").write_text(TESTS)
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-W", "ignore", *args]
    out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out.stdout


def test_grouped_tests_share_one_worker(tmp_path):
    ran = re.findall(
        r"\[(gw\d)\] \[\s*\d+%\] PASSED test_x.py::(test_\w)", _run(tmp_path, "-v", "-n", "2", "--dist", "loadgroup")
    )
    workers = {name: worker for worker, name in ran}
    assert len(workers) == 5
    assert workers["test_b"] == workers["test_c"]


def test_tests_that_start_engines_go_first(tmp_path):
    order = re.findall(r"^test_x.py::(test_\w)", _run(tmp_path, "--collect-only", "-q"), re.M)
    assert order == ["test_z", "test_a", "test_b", "test_c", "test_d"]
