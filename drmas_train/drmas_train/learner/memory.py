"""A training process's memory peaks, read once per step (`mem/<pool>/<rank>/...` in metrics.jsonl)."""

from __future__ import annotations

import resource
import sys


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def read_peaks() -> dict[str, float]:
    """The calling process's peaks: `peak_device_gib`, the most GPU memory torch held since the last call (then
    reset, so each call covers one step; absent without CUDA), and `peak_rss_mb`, the process's peak
    resident memory so far (the kernel keeps no per-interval peak).
    """
    out = {"peak_rss_mb": peak_rss_mb()}
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["peak_device_gib"] = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
    return out
