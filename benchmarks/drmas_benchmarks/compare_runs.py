"""Do two runs agree? Every metric of two runs' metrics.jsonl, row by row, except wall times and memory.

    python -m drmas_benchmarks.compare_runs runs/a runs/b

Prints each differing (step, metric, a, b) and the count; exits 1 when any differ. Time (`time/*`), memory
(`mem/*`) and rates (`*per_s`) are left out: they follow the machine's load, not the run's arithmetic.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def skipped(key: str) -> bool:
    """Metrics that measure the machine rather than the run."""
    return key.startswith(("time/", "mem/")) or key.endswith("per_s")


def differences(a: Path, b: Path) -> list[tuple[int | None, str, object, object]]:
    """(step, metric, value in a, value in b) for every metric that differs, or is missing from one run."""
    from drmas_benchmarks.stability.analysis import read_jsonl

    rows_a, rows_b = read_jsonl(a / "metrics.jsonl"), read_jsonl(b / "metrics.jsonl")
    out: list[tuple[int | None, str, object, object]] = []
    if len(rows_a) != len(rows_b):
        out.append((None, "rows", len(rows_a), len(rows_b)))
    for ra, rb in zip(rows_a, rows_b):
        for key in sorted(set(ra) | set(rb)):
            if not skipped(key) and ra.get(key) != rb.get(key):
                out.append((ra.get("step"), key, ra.get(key), rb.get(key)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    args = ap.parse_args()
    diff = differences(args.a, args.b)
    for step, key, va, vb in diff:
        print(f"step {step}: {key}: {va!r} != {vb!r}")
    print(f"{len(diff)} differing values")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
