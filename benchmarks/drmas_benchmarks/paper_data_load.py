"""Load cost of the paper's data layer: a Search-R1-sized Parquet training set, and make() on a mix.

    .venv/bin/python -m drmas_benchmarks.paper_data_load [--rows 170000] \\
        [--out benchmarks/results/paper_data_load.md]

Builds synthetic files in the hub's layout in a temporary folder (Search-R1 columns for
`nq_hotpotqa_train`, the reference's math test sources for `math_test_sampled`), then times the first
load (read, parse, sha256 for provenance), a repeated load, and `make()` calls. Needs pyarrow.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import drmas_envs
from drmas_benchmarks.machine import cpu_line
from drmas_envs.search.data import load_questions
from drmas_envs.testing import search_rows, write_math_hub_layout, write_rows


def timed(fn, repeats: int = 1) -> float:
    """Seconds per call of `fn`, over `repeats` calls."""
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=170_000)
    parser.add_argument("--makes", type=int, default=300)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ["HF_HUB_OFFLINE"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        half = args.rows // 2
        train = write_rows(
            root / "PeterJinGo" / "nq_hotpotqa_train" / "train.parquet",
            search_rows("train", {"nq": half, "hotpotqa": args.rows - half}),
        )
        mb = train.stat().st_size / 2**20
        cold = timed(lambda: load_questions("nq_hotpotqa_train", None, tmp))
        warm = timed(lambda: load_questions("nq_hotpotqa_train", None, tmp), 100)
        write_math_hub_layout(root, {"math500": 500, "aime24": 30, "aime25": 30})
        drmas_envs.make("math-2agent", dataset="math_test_sampled", data_dir=tmp)
        drmas_envs.make("math-2agent", dataset="math500", data_dir=tmp)
        mix = timed(lambda: drmas_envs.make("math-2agent", dataset="math_test_sampled", data_dir=tmp), args.makes)
        single = timed(lambda: drmas_envs.make("math-2agent", dataset="math500", data_dir=tmp), args.makes)
        generated = timed(lambda: drmas_envs.make("math-2agent"), args.makes)
    load = os.getloadavg()[0]
    lines = [
        "# Paper data load cost",
        "",
        f"`python -m drmas_benchmarks.paper_data_load --rows {args.rows}` on {cpu_line()}; "
        f"Python {sys.version.split()[0]}; "
        f"load average at the end {load:.1f} (the machine is shared with other engineers, so figures vary run to run).",
        "Synthetic rows in the hub's layout (Search-R1 columns); the real files' sizes differ.",
        "",
        "| what | time |",
        "|---|---|",
        f"| `nq_hotpotqa_train`, {args.rows:,} rows ({mb:.1f} MiB Parquet): first load (read 5 of 8 columns, "
        f"parse, sha256) | {cold:.2f} s |",
        f"| the same, repeated (cached) | {warm * 1e6:.1f} us |",
        f"| `make('math-2agent', dataset='math_test_sampled')` (110 items, 3 hub-layout members), "
        f"mean of {args.makes} | {mix * 1e3:.2f} ms |",
        f"| `make('math-2agent', dataset='math500')` (hub layout), mean of {args.makes} | {single * 1e3:.2f} ms |",
        f"| `make('math-2agent')` (generated), mean of {args.makes} | {generated * 1e3:.2f} ms |",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
