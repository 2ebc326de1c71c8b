"""The machine line benchmark reports print beside their figures: CPU model, vector extensions, cores."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from drmas_train.engines.settings import NATIVE_BF16_CPU_FLAGS, cpu_flags


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    named = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name") and ":" in ln), None)
    return named or platform.processor() or platform.machine() or "unknown CPU"


def cpu_line() -> str:
    """The CPU model, its widest vector extension (AVX-512 / AVX2) and native bf16 units, and the core count.

    Figures differ by these: fp32 matmul speed follows the vector width, and bf16 matmul is far slower on a
    CPU without native bf16 (docs/measurements.md); the bf16 flags are those `models.gen_dtype: auto` reads.
    """
    flags = cpu_flags()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    extra = [f for f in NATIVE_BF16_CPU_FLAGS if f in flags]
    return f"{cpu_model()}, {isa}{' (' + ', '.join(extra) + ')' if extra else ''}, {os.cpu_count()} cores"
