"""The C allocator's policy in a training process: freed memory stays in the process for reuse.

Why: glibc's malloc serves every block above its mmap threshold (128 KiB at first, at most 32 MiB)
with fresh pages from the kernel and hands them back on free, and it trims the heap's top whenever more
than a small threshold lies free there. A learner allocates and frees the same few hundred MiB of
activations and gradients in every micro-batch, so every pass pays one minor page fault (the kernel
zeroing a 4 KiB page) per page it touches. With mmap off for large blocks and no trimming, freed blocks
stay in the heap and the next micro-batch reuses them: far fewer page faults and less kernel time, with
every metric unchanged (measured in benchmarks/results/learner_precision.md, "Page faults").

Cost: the process keeps its peak heap (RSS does not fall after a peak) and what it cannot reuse as block
sizes change (measured, with what was tried to lower it, in benchmarks/results/allocator_memory.md).
The setting is process-wide and cannot be undone, so it is a config field (`keep_freed_memory`), applied
where a run owns its process: the `Trainer` and each Ray placement worker. Only glibc has these knobs;
elsewhere (macOS, musl) nothing changes.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_NEVER_TRIM = 2**31 - 1  # mallopt takes an int: the largest is "never" for any heap this process grows
_applied = False


def _glibc() -> ctypes.CDLL | None:
    """The running C library when it is glibc, else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - raises AttributeError outside glibc
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory in this process: no mmap for large blocks, no trimming of the heap.

    Returns:
        True when the policy is in force (applied now or earlier), False where the C library is not glibc
        or refused a setting (then nothing changed that matters: each setting only avoids page faults).

    """
    global _applied
    if _applied:
        return True
    libc = _glibc()
    if libc is None:
        log.info("keep_freed_memory: not glibc; the C allocator's policy is left as it is")
        return False
    # mallopt returns 1 on success, 0 on an out-of-range value
    if not (libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM)):
        log.warning("keep_freed_memory: glibc refused mallopt; freed memory goes back to the kernel as before")
        return False
    _applied = True
    return True
