"""What a search team did step by step, read from a run's trajectories.jsonl: per training step and source,
the share of episodes whose k-th search found a supporting passage first (a search call with a retrieval
bonus, `env.kwargs.retrieval_reward` > 0), the share answered right, and the share of two-hop episodes whose
two searches both found one (the chain the question needs).

    .venv/bin/python -m drmas_benchmarks.search_trajectories runs/two-hop [--json OUT.json]

Needs a run with `log.trajectories` on (the default) and `retrieval_reward` > 0 (without it no call carries
a bonus: the search columns are then empty).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def step_rows(path: Path) -> list[dict]:
    """One row per (step, source): episodes, right answers, and the share of each search that found a passage."""
    counts: dict[tuple[int, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for line in path.read_text().splitlines():
        ep = json.loads(line)
        searches = [c for c in ep["calls"] if c["agent"] in ("search", "searcher")]
        row = counts[(ep["step"], ep.get("source") or "all")]
        row["episodes"] += 1
        row["right"] += float(ep["team_reward"] >= 1)
        found = [c["reward"] > ep["team_reward"] for c in searches]  # only a bonus lifts a call above the team
        for k, hit in enumerate(found, start=1):
            row[f"search{k}_found"] += hit
        row["chain_found"] += len(found) >= 2 and all(found[:2])
    out = []
    for (step, source), row in sorted(counts.items()):
        n = row["episodes"]
        shares = {k: round(v / n, 3) for k, v in row.items() if k != "episodes"}
        out.append({"step": step, "source": source, "episodes": int(n), **shares})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()
    rows = step_rows(args.run_dir / "trajectories.jsonl")
    cols = ["step", "source", "episodes", "right", "search1_found", "search2_found", "chain_found"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "-")) for c in cols) + " |" for r in rows]
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
