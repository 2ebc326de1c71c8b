"""`keep_freed_memory`: a freed large block is reused without page faults; the Trainer applies it.

The blocks come from the C library's own malloc, the allocator torch's CPU tensors use.

Each measurement runs in a fresh interpreter, since the policy is process-wide and permanent.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from drmas_train.learner.allocator import _glibc

MIB = 64  # above glibc's largest mmap threshold (32 MiB): served by mmap unless the policy is on
PAGES = MIB * 2**20 // 4096

# After its own setup (argv[1]: keep | default | trainer-true | trainer-false), a fresh interpreter
# allocates, touches and frees one block of argv[2] MiB three times, and counts the page faults of each.
SCRIPT = """
import ctypes, json, resource, sys
from drmas_train.learner.allocator import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
if sys.argv[1].startswith("trainer-"):
    from drmas_train.config import build_config
    from drmas_train.run.trainer import Trainer
    flag = sys.argv[1] == "trainer-true"
    over = {"log.run_dir": sys.argv[3], "steps": 0, "keep_freed_memory": flag}
    Trainer(build_config("smoke", over)).close()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
size = int(sys.argv[2]) * 2**20
faults = []
for _ in range(3):  # allocate, touch every page, free
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(size)
    libc.memset(block, 1, size)
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"applied": applied, "faults": faults}))
"""

pytestmark = pytest.mark.skipif(_glibc() is None, reason="the allocator policy exists only under glibc (Linux)")


def _faults(mode: str, run_dir: Path | None = None) -> dict:
    argv = [sys.executable, "-c", SCRIPT, mode, str(MIB), str(run_dir)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _thp_always() -> bool:
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return path.exists() and "[always]" in path.read_text()


def test_a_freed_block_is_reused_without_page_faults():
    kept = _faults("keep")
    assert kept["applied"] is True
    # the first allocation grows the heap (faults); the later ones reuse its pages
    assert max(kept["faults"][1:]) < 0.1 * PAGES, kept


def test_without_the_policy_every_allocation_faults_its_pages_again():
    if _thp_always():
        pytest.skip("transparent huge pages are 'always' here: a fresh mapping faults in 2 MiB pages")
    default = _faults("default")
    assert default["applied"] is None
    assert min(default["faults"][1:]) > 0.5 * PAGES, default


def test_the_trainer_applies_it_iff_the_field_is_true(tmp_path):
    kept = _faults("trainer-true", tmp_path / "true")
    assert max(kept["faults"][1:]) < 0.1 * PAGES, kept
    if _thp_always():
        pytest.skip("transparent huge pages are 'always' here: a fresh mapping faults in 2 MiB pages")
    returned = _faults("trainer-false", tmp_path / "false")
    assert min(returned["faults"][1:]) > 0.5 * PAGES, returned
