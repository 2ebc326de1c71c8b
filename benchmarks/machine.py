"""The machine line benchmark reports print beside their figures: CPU model, vector extensions, cores."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_line() -> str:
    """The CPU model, its widest vector extension (AVX-512 / AVX2) and native bf16 units, and the core count.

    Figures differ by these: fp32 matmul speed follows the vector width, and bf16 is ~100x slower on a CPU
    without native bf16 (README). Read from /proc/cpuinfo where present.
    """
    model, flags = platform.processor() or platform.machine() or "unknown CPU", set()
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and ":" in line:
                flags = set(line.split(":", 1)[1].split())
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    extra = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return f"{model}, {isa}{' (' + ', '.join(extra) + ')' if extra else ''}, {os.cpu_count()} cores"
