"""A broken env fails the suite: the per-env tests turn no missing module or exception into a skip.

An installed package declares an env (entry-point group `drmas_envs.envs`) whose module does not
exist; the registry and fuzz tests, run on it in a fresh pytest process, must fail, not skip.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.parametrize("test_file", ["test_registry.py", "test_fuzz.py"])
def test_per_env_tests_fail_on_a_broken_env(tmp_path, test_file):
    dist = tmp_path / "broken_team-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-team\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[drmas_envs.envs]\nbroken-env = no_such_module_xyz.team:make\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "pytest", str(HERE / test_file), "-k", "broken-env", "-q", "-p", "no:cacheprovider"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    summary = out.stdout.strip().splitlines()[-1]
    assert out.returncode == 1, out.stdout[-2000:]
    assert "failed" in summary and "skipped" not in summary and "passed" not in summary, summary
    assert "no module named 'no_such_module_xyz.team'" in out.stdout
