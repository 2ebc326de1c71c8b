"""Plot one run's curves (rewards, accuracy, validity, grad norm, baseline keys, validation) from its metrics.jsonl.

.venv/bin/python -m drmas_benchmarks.plot_run runs/cpu --out benchmarks/results/cpu_default/curves.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from drmas_train.engines.extras import require

require("matplotlib", "bench", "plotting a run")
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TEAM = ("team reward and accuracy", ["reward/team", "accuracy"])
PER_AGENT = (
    ("per-agent reward (team reward - penalties + bonuses)", "reward/"),
    ("well-formed calls (share)", "valid/"),
    ("pre-clip gradient norm", "grad_norm/"),
)
NOT_AGENTS = ("team", "mean")
"""`reward/team` and `reward/mean` are the team's, not an agent's."""
VERDICTS = ("Verifier: approval of right / wrong attempts", ["approve_right", "approve_wrong"])
GROUPS = (
    (
        "calls with no signal: in a one-sample key / an all-equal-reward key (share)",
        ("singleton_share", "zero_var_share"),
    ),
    ("baseline key size (samples): min / median / max", ("size_min", "size_median", "size_max")),
)
VALIDATION = (
    "held-out validation (before step 1 and every eval.every steps)",
    ("val/avg@", "val/pass@", "val/answer_acc"),
)
VAL_DETAIL = "held-out validation per source (avg@k) and well-formed calls per agent"


def agent_panels(rows: list[dict]) -> list[tuple[str, list[str]]]:
    """Per-agent reward, validity and grad norm, for the agents (or models) the run logged."""
    out = []
    for title, prefix in PER_AGENT:
        keys = sorted({k for r in rows for k in r if k.startswith(prefix) and k.count("/") == 1})
        keys = [k for k in keys if k.split("/", 1)[1] not in NOT_AGENTS]
        if keys:
            out.append((title, keys))
    return out


def validation_detail(rows: list[dict]) -> list[str]:
    """Per-source avg@k (`val/<source>/avg@k`, e.g. per hop count) and `val/valid/<agent>`."""
    keys = {k for r in rows for k in r if k.startswith("val/") and k.count("/") == 2}
    return sorted(k for k in keys if "/avg@" in k or k.startswith("val/valid/"))


def group_panels(rows: list[dict]) -> list[tuple[str, list[str]]]:
    """The baseline-key diagnostics (`groups/<agent>/...`), for every agent the run logged them for."""
    keys = sorted({k for r in rows for k in r if k.startswith("groups/")})
    panels = [(title, [k for k in keys if k.rsplit("/", 1)[1] in stats]) for title, stats in GROUPS]
    return [(title, ks) for title, ks in panels if ks]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("--out", required=True)
    p.add_argument("--smooth", type=int, default=5, help="moving-average window drawn over the raw curve")
    args = p.parse_args()
    rows = [json.loads(line) for line in (Path(args.run_dir) / "metrics.jsonl").read_text().splitlines() if line]
    val_keys = sorted({k for r in rows for k in r if k.startswith(VALIDATION[1])})
    has_verdicts = any(k in r for r in rows for k in VERDICTS[1])
    detail = validation_detail(rows)
    panels = [TEAM, *agent_panels(rows)] + ([VERDICTS] if has_verdicts else []) + group_panels(rows)
    panels += [(VALIDATION[0], val_keys)] if val_keys else []
    panels += [(VAL_DETAIL, detail)] if detail else []
    val_keys = val_keys + detail
    cols = min(4, len(panels))
    n_rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(n_rows, cols, figsize=(5 * cols, 3.6 * n_rows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (title, keys) in zip(axes.flat, panels):
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if key in val_keys and pts:  # a few points: drawn as they are, with markers
                ax.plot(*zip(*pts), marker="o", label=key)
                continue
            if not pts:
                continue
            steps, vals = zip(*pts)
            line = ax.plot(steps, vals, alpha=0.35)[0]
            w = max(1, min(args.smooth, len(vals)))
            windows = [vals[max(0, i - w + 1) : i + 1] for i in range(len(vals))]
            avg = [sum(win) / len(win) for win in windows]
            ax.plot(steps, avg, color=line.get_color(), label=f"{key} ({w}-step mean)")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
