"""The peak of a process's anonymous memory (RssAnon), sampled while a block runs (Linux only).

RssAnon counts the memory the kernel cannot drop: tensors, heaps, copies. Pages of memory-mapped
files (what safetensors reads through) are RssFile instead, so a loader that maps a checkpoint and
copies only its own part shows that part here, not the file. Linux keeps no high-water mark of
RssAnon alone (VmHWM counts file pages too), so a thread reads /proc/self/status every `interval_s`
seconds; a spike shorter than that can be missed, so callers also `sample()` at their own checkpoints.
"""

from __future__ import annotations

import threading
from pathlib import Path

STATUS = Path("/proc/self/status")


def rss_anon() -> int:
    """RssAnon of the calling process now, in bytes."""
    for line in STATUS.read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{STATUS} has no RssAnon line (not Linux?)")


class AnonPeak:
    """`with AnonPeak() as peak: ...`, then `peak.peak` (bytes) is the largest RssAnon seen inside.

    `peak.start` is RssAnon on entry (the baseline).
    """

    def __init__(self, interval_s: float = 0.0005):
        self.interval_s = interval_s
        self.start = self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> int:
        """Read RssAnon now and keep it if it is the peak; returns it."""
        now = rss_anon()
        self.peak = max(self.peak, now)
        return now

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> AnonPeak:
        self.start = self.peak = rss_anon()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
