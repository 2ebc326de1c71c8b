"""Grader sweep over real data: for every item of <data>/math/*.jsonl,

- `... \\boxed{<reference>}` must grade correct (extraction and equivalence together), and
- another item's different reference must grade wrong (the next item, cyclically, whose answer differs
  after normalisation).

Writes a markdown table and every miss to benchmarks/results/grade_real_data.md.

    .venv/bin/python -m drmas_benchmarks.grade_real_data [--data ../shared/data] [--limit N] [--timeout 5]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from drmas_envs.math.answers import extract_answer
from drmas_envs.math.datasets import load_jsonl_tasks
from drmas_envs.math.grading import Grader, normalise

ROOT = Path(__file__).resolve().parents[2]


def sweep_file(path: Path, grader: Grader, limit: int | None) -> tuple[dict, list[str]]:
    tasks = load_jsonl_tasks(path)
    n = len(tasks) if limit is None else min(limit, len(tasks))
    misses: list[str] = []
    right = wrong = mv_right = 0
    t0 = time.perf_counter()
    for i in range(n):
        ref = tasks[i]["answer"]
        answer, _ = extract_answer(f"So the final answer is $\\boxed{{{ref}}}$.")
        if answer is not None and grader(answer, ref):
            right += 1
        else:
            misses.append(f"{path.name} {tasks[i]['id']}: `\\boxed{{{ref}}}` graded WRONG (extracted {answer!r})")
        # the same check with the fast path bypassed: does math-verify alone accept the reference?
        if answer is not None and grader.ask_worker(answer, ref):
            mv_right += 1
        else:
            misses.append(f"{path.name} {tasks[i]['id']}: math-verify alone graded `{ref}` WRONG against itself")
        other = next(
            tasks[j % len(tasks)]["answer"]
            for j in range(i + 1, i + len(tasks))
            if normalise(tasks[j % len(tasks)]["answer"]) != normalise(ref)
        )
        if not grader(other, ref):
            wrong += 1
        else:
            misses.append(f"{path.name} {tasks[i]['id']}: `{other}` graded RIGHT against reference `{ref}`")
    dt = time.perf_counter() - t0
    return {"file": path.name, "n": n, "right": right, "mv_right": mv_right, "wrong": wrong, "seconds": dt}, misses


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--limit", type=int, default=None, help="items per file (default: all)")
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "grade_real_data.md"))
    args = ap.parse_args()
    grader = Grader(timeout_s=args.timeout)
    rows, misses = [], []
    for path in sorted((Path(args.data) / "math").glob("*.jsonl")):
        row, m = sweep_file(path, grader, args.limit)
        rows.append(row)
        misses.extend(m)
        print(row, flush=True)
    command = "python -m drmas_benchmarks.grade_real_data" + (f" --limit {args.limit}" if args.limit else "")
    lines = [
        f"Grader sweep (`{command}`, timeout {args.timeout} s, grader stats {grader.stats})",
        "",
        "| file | items | reference graded right | same, math-verify alone | other reference graded wrong | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['file']} | {r['n']} | {r['right']}/{r['n']} ({100 * r['right'] / r['n']:.2f}%) "
            f"| {r['mv_right']}/{r['n']} ({100 * r['mv_right'] / r['n']:.2f}%) "
            f"| {r['wrong']}/{r['n']} ({100 * r['wrong'] / r['n']:.2f}%) | {r['seconds']:.1f} |"
        )
    lines += ["", f"## Misses ({len(misses)})", ""] + [f"- {m}" for m in misses]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:40]))
    grader.close()


if __name__ == "__main__":
    main()
