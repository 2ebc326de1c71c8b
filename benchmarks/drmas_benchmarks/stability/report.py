"""Report on finished `drmas-train` runs: grad-norm stability per model, rewards, advantage moments.

    .venv/bin/python -m drmas_benchmarks.stability.report RUN_DIR [RUN_DIR ...] --out benchmarks/results/stability/NAME

Each run directory holds `config.yaml` (estimator and seed are read from it) and `metrics.jsonl`
(one row per step: `grad_norm/<model>`, `learner/<model>/skipped`, `accuracy`, `reward/team`,
`reward/<agent>`, `valid/<agent>`, `time/step`, `adv/<agent>/sq_mean`, `adv_global/<agent>/sq_mean`,
`adv_global/<agent>/gap`) and, where the run validated, `val/*` rows (step 0: before training).
Writes `README.md` (tables) and PNG plots into the output folder. Definitions are those of
`drmas_benchmarks.stability.analysis`: a spike is a step above 5x the running median of the previous 20 steps.
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from drmas_benchmarks.stability import heldout
from drmas_benchmarks.stability.analysis import as_float, grad_norm_summary, read_jsonl
from drmas_train.engines.extras import require

FINAL_STEPS = 5  # "final" figures average the last few steps, since one step's reward is noisy
WINDOWS = 3  # the learning table splits the steps into this many windows (early / middle / late)


@dataclass
class Run:
    path: Path
    estimator: str
    seed: int
    rows: list[dict[str, Any]]
    """Training steps (step >= 1), in order."""
    val_rows: list[dict[str, Any]] = field(default_factory=list)
    """Rows with `val/*` metrics: the step-0 validation and training rows where validation was due."""
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.estimator} s{self.seed}"

    def series(self, key: str) -> np.ndarray:
        return np.array([as_float(r.get(key)) for r in self.rows], dtype=np.float64)

    def keys(self, prefix: str, suffix: str = "") -> list[str]:
        """The middle parts of keys `<prefix><name><suffix>` (e.g. models of `grad_norm/`)."""
        names = set()
        for row in self.rows:
            for k in row:
                if k.startswith(prefix) and k.endswith(suffix) and len(k) > len(prefix) + len(suffix):
                    names.add(k[len(prefix) : len(k) - len(suffix)])
        return sorted(n for n in names if "/" not in n)


def load_run(path: str | Path) -> Run:
    """Read one run directory (config.yaml + metrics.jsonl); the step-0 validation row is no training step."""
    path = Path(path)
    cfg = yaml.safe_load((path / "config.yaml").read_text()) if (path / "config.yaml").is_file() else {}
    every = read_jsonl(path / "metrics.jsonl")
    rows = [r for r in every if int(r.get("step", 0)) >= 1]
    if not rows:
        raise ValueError(f"{path}/metrics.jsonl has no training steps")
    val_rows = [r for r in every if any(k.startswith("val/") for k in r)]
    estimator = str(cfg.get("algo", {}).get("estimator", "?"))
    return Run(path, estimator, int(cfg.get("seed", 0)), rows, val_rows, cfg or {})


def final(values: np.ndarray) -> float:
    """Mean of the last FINAL_STEPS finite values."""
    v = values[np.isfinite(values)]
    return float(v[-FINAL_STEPS:].mean()) if v.size else float("nan")


def run_summary(run: Run) -> dict[str, dict[str, float]]:
    """Per model: grad-norm summary, skipped optimizer steps, final accuracy and team reward."""
    out = {}
    for model in run.keys("grad_norm/"):
        s = grad_norm_summary(run.series(f"grad_norm/{model}").tolist())
        skipped = run.series(f"learner/{model}/skipped")
        if np.isfinite(skipped).any():
            s["skipped"] = max(s["skipped"], float(np.nansum(skipped)))
        s["accuracy"] = final(run.series("accuracy"))
        s["reward_team"] = final(run.series("reward/team"))
        out[model] = s
    return out


def agent_summary(run: Run) -> dict[str, dict[str, float]]:
    """Per agent: mean over steps of E[A^2] (in use and global), the gap term, final reward."""
    out = {}
    for agent in run.keys("adv/", "/sq_mean"):
        out[agent] = {
            "sq_mean": nanmean(run.series(f"adv/{agent}/sq_mean")),
            "sq_mean_global": nanmean(run.series(f"adv_global/{agent}/sq_mean")),
            "gap": nanmean(run.series(f"adv_global/{agent}/gap")),
            "reward": final(run.series(f"reward/{agent}")),
        }
    return out


def nanmax(x: np.ndarray) -> float:
    return float(np.max(x[np.isfinite(x)])) if np.isfinite(x).any() else float("nan")


def nanmedian(x: np.ndarray) -> float:
    return float(np.median(x[np.isfinite(x)])) if np.isfinite(x).any() else float("nan")


def nanmean(x) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(np.mean(x[np.isfinite(x)])) if np.isfinite(x).any() else float("nan")


def rate(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:.2f}"


def fmt(x: float, digits: int = 3) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:.{digits}g}"


def tables(runs: list[Run]) -> str:
    """The markdown tables: per estimator and model, per run, per agent."""
    by_est: dict[tuple[str, str], list[dict[str, float]]] = defaultdict(list)
    lines = ["## Gradient norm per model (pre-clip), over seeds", ""]
    lines += [
        "| estimator | model | runs | median of medians | median of p90s | max | max / median (worst run) | spikes "
        "| skipped | zero-signal steps | final accuracy | final team reward |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        for model, s in run_summary(run).items():
            by_est[(run.estimator, model)].append(s)
    for (est, model), ss in sorted(by_est.items()):
        col = {k: np.array([s[k] for s in ss]) for k in ss[0]}
        lines.append(
            f"| {est} | {model} | {len(ss)} | {fmt(nanmedian(col['median']))} | {fmt(nanmedian(col['p90']))} "
            f"| {fmt(nanmax(col['max']))} "
            f"| {fmt(nanmax(col['max_over_median']))} | {int(col['spikes'].sum())} | {int(col['skipped'].sum())} "
            f"| {int(col['zero'].sum())} | {fmt(nanmean(col['accuracy']))} | {fmt(nanmean(col['reward_team']))} |"
        )
    lines += [
        "",
        "## Per run",
        "",
        "| run | model | steps | median | p90 | max | max / median | spikes | skipped | zero |",
    ]
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for run in runs:
        for model, s in run_summary(run).items():
            lines.append(
                f"| {run.label} | {model} | {int(s['steps'])} | {fmt(s['median'])} | {fmt(s['p90'])} | {fmt(s['max'])} "
                f"| {fmt(s['max_over_median'])} | {int(s['spikes'])} | {int(s['skipped'])} | {int(s['zero'])} |"
            )
    lines += ["", "## Per-agent advantage second moment (mean over steps and seeds)", ""]
    lines += [
        "E[A^2 | agent] under the estimator in use and under the global (pooled) baseline; gap = mean of "
        "(mu_k - mu)^2 / s^2, the part the paper attributes to the agent's reward mean sitting away from the "
        "group's.",
        "",
        "| estimator | agent | E[A^2] in use | E[A^2] global | gap | final reward |",
        "|---|---|---|---|---|---|",
    ]
    by_agent: dict[tuple[str, str], list[dict[str, float]]] = defaultdict(list)
    for run in runs:
        for agent, s in agent_summary(run).items():
            by_agent[(run.estimator, agent)].append(s)
    for (est, agent), ss in sorted(by_agent.items()):
        m = {k: nanmean([s[k] for s in ss]) for k in ss[0]}
        lines.append(
            f"| {est} | {agent} | {fmt(m['sq_mean'])} | {fmt(m['sq_mean_global'])} | {fmt(m['gap'])} "
            f"| {fmt(m['reward'])} |"
        )
    return "\n".join(lines) + "\n"


def windowed_means(values: np.ndarray, windows: int) -> list[float]:
    """Means of `values` over `windows` consecutive, near-equal runs of steps (NaNs ignored)."""
    return [nanmean(part) for part in np.array_split(values, min(windows, max(values.size, 1)))]


def learning_table(runs: list[Run], windows: int = WINDOWS) -> str:
    """What the runs learn: per estimator, each agent's well-formed share and reply length, the
    Verifier's approvals (envs that grade its verdicts) and accuracy, over step windows.

    One step's rates come from a handful of episodes, so windows of several steps are what can be
    read; the steps compared are those every run has. With several seeds per estimator, one row per
    run follows the estimator rows, so a reader sees whether every seed agrees with the mean.
    """
    n = min(len(r.rows) for r in runs)
    if n == 0:
        return ""
    bounds = [(int(part[0]) + 1, int(part[-1]) + 1) for part in np.array_split(np.arange(n), min(windows, n))]
    span = " / ".join(f"{a}-{b}" for a, b in bounds)
    agents = sorted({a for r in runs for a in r.keys("valid/")})
    columns = [(f"{a} well-formed", f"valid/{a}", rate) for a in agents]
    columns += [
        (f"{a} reply tokens", f"response_tokens/{a}", fmt)
        for a in sorted({a for r in runs for a in r.keys("response_tokens/")})
    ]
    columns += [
        (f"approve {w}", f"approve_{w}", rate)
        for w in ("right", "wrong")
        if any(f"approve_{w}" in row for r in runs for row in r.rows)
    ]
    columns.append(("accuracy", "accuracy", rate))
    lines = [
        "## What the runs learn",
        "",
        f"Mean over steps {span} (and over seeds) of each agent's well-formed share of calls (`valid/<agent>`), "
        "its reply length in tokens (`response_tokens/<agent>`), where the env grades the Verifier's verdicts "
        "how often it approved a right / a wrong attempt (`approve_right` / `approve_wrong`), and accuracy; "
        "the last column is the mean wall time of a step.",
        "",
        "| estimator | " + " | ".join(head for head, _, _ in columns) + " | s / step |",
        "|---" * (len(columns) + 2) + "|",
    ]
    estimators = sorted({r.estimator for r in runs})
    groups = [(est, [r for r in runs if r.estimator == est]) for est in estimators]
    if len(runs) > len(estimators):
        groups += [(r.label, [r]) for r in sorted(runs, key=lambda r: (r.estimator, r.seed))]
    lines += [_learning_row(label, mine, columns, n, windows) for label, mine in groups]
    return "\n".join(lines) + "\n"


def _learning_row(
    label: str, runs: list[Run], columns: list[tuple[str, str, Callable[[float], str]]], n: int, windows: int
) -> str:
    """One learning-table row: each column's windowed means over the first `n` steps, averaged over `runs`."""
    cells = []
    for _, key, show in columns:
        per_run = np.array([windowed_means(r.series(key)[:n], windows) for r in runs])
        cells.append(" / ".join(show(nanmean(col)) for col in per_run.T))
    seconds = nanmean([nanmean(r.series("time/step")[:n]) for r in runs])
    return f"| {label} | " + " | ".join(cells) + f" | {fmt(seconds)} |"


def plots(runs: list[Run], out: Path) -> list[str]:
    """Grad-norm, reward and advantage-moment curves; returns the PNG file names."""
    require("matplotlib", "bench", "the stability report's figures")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    estimators = sorted({r.estimator for r in runs})
    color = {e: plt.get_cmap("tab10")(i) for i, e in enumerate(estimators)}
    files = []
    for model in sorted({m for r in runs for m in r.keys("grad_norm/")}):
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in runs:
            y = r.series(f"grad_norm/{model}")
            y[y == 0] = np.nan  # zero-signal steps show as gaps (a log axis has no 0)
            ax.plot(np.arange(1, y.size + 1), y, ".-", color=color[r.estimator], alpha=0.8, label=r.label)
        title = f"gradient norm: {model} (gaps: zero-signal or skipped steps)"
        ax.set(xlabel="step", ylabel="pre-clip grad norm", title=title)
        if any((r.series(f"grad_norm/{model}") > 0).any() for r in runs):
            ax.set_yscale("log")
        ax.legend(fontsize=7)
        files.append(_save(fig, out / f"grad_norm_{model}.png"))
    agents = sorted({a for r in runs for a in r.keys("adv/", "/sq_mean")})
    keys = ["accuracy", "reward/team"] + [f"reward/{a}" for a in agents]
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.5), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for est in estimators:
            ys = [r.series(key) for r in runs if r.estimator == est]
            n = min(len(y) for y in ys)
            ax.plot(np.arange(1, n + 1), np.nanmean([y[:n] for y in ys], axis=0), color=color[est], label=est)
        ax.set(xlabel="step", title=f"{key} (mean over seeds)")
    axes[0][0].legend(fontsize=7)
    files.append(_save(fig, out / "rewards.png"))
    if agents:
        fig, axes = plt.subplots(1, len(agents), figsize=(5 * len(agents), 3.5), squeeze=False)
        for ax, agent in zip(axes[0], agents):
            for est in estimators:
                for prefix, style in (("adv", "-"), ("adv_global", ":")):
                    ys = [r.series(f"{prefix}/{agent}/sq_mean") for r in runs if r.estimator == est]
                    n = min(len(y) for y in ys)
                    lab = f"{est} ({'in use' if prefix == 'adv' else 'global'})"
                    y = np.nanmean([y[:n] for y in ys], axis=0)
                    ax.plot(np.arange(1, n + 1), y, style, color=color[est], label=lab)
            ax.set(xlabel="step", title=f"E[A^2 | {agent}]")
        axes[0][0].legend(fontsize=6)
        files.append(_save(fig, out / "adv_sq_mean.png"))
    return files


def _save(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path.name


def _show(path: Path) -> str:
    """A path relative to the working directory when it is inside it (links kept: runs may live elsewhere)."""
    try:
        return str(Path(os.path.abspath(path)).relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def write_report(
    run_dirs: list[str | Path],
    out: str | Path,
    *,
    title: str = "Stability",
    command: str = "",
    max_steps: int | None = None,
) -> Path:
    """Write README.md and the plots for these runs into `out`; returns the README's path.

    `max_steps` keeps each run's first steps only, so runs that went further are compared with the
    others over the same steps.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = sorted((load_run(p) for p in run_dirs), key=lambda r: (r.estimator, r.seed))
    if max_steps is not None:
        for run in runs:
            run.rows = [r for r in run.rows if int(r.get("step", 0)) <= max_steps]
            run.val_rows = [r for r in run.val_rows if int(r.get("step", 0)) <= max_steps]
    files = plots(runs, out) + heldout.plot(runs, out)
    head = [f"# {title}", ""]
    if command:
        head += ["Command:", "", "```bash", command, "```", ""]
    head += [f"Runs: {', '.join(f'`{_show(r.path)}`' for r in runs)}.", ""]
    lengths = sorted({len(r.rows) for r in runs})
    head += [
        f"Steps per run: {', '.join(map(str, lengths))}" + (f" (capped at {max_steps})" if max_steps else "") + ".",
        "",
    ]
    head += [
        "A spike is a step above 5x the running median of the previous 20 non-zero norms; zero-signal steps "
        "(every advantage 0, grad norm exactly 0) and skipped steps take no part in the statistics.",
        "",
    ]
    held = heldout.section(runs)
    body = "\n" + tables(runs) + "\n" + learning_table(runs) + ("\n" + held if held else "")
    body += "\n" + "\n".join(f"![{f}]({f})" for f in files) + "\n"
    readme = out / "README.md"
    readme.write_text("\n".join(head) + body)
    return readme


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="run directories")
    p.add_argument("--out", required=True, help="output folder (README.md and PNGs)")
    p.add_argument("--title", default="Stability")
    args = p.parse_args()
    print(write_report(args.runs, args.out, title=args.title))


if __name__ == "__main__":
    main()
