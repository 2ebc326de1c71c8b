"""Held-out accuracy of stability runs: validation curves, gains over seeds, paired differences to a baseline.

The runs log `val/*` metrics (`drmas_train.run.validation`) at step 0 (before training) and every
`eval.every` steps. A gain is a run's value at the last validation step every run has minus its
value at the first; gains are summarised over seeds with a t-interval, and against the baseline
estimator (grpo) per seed, where the two runs share data order and initial weights (same seed,
configs equal but for the estimator).

The statistics (`t_quantile`, `t_interval`, `paired_differences`, `gain`) are pure functions of
plain numbers; `section` and `plot` read runs with `estimator`, `seed`, `config` and `val_rows`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

BASELINE = "grpo"
# Second pairing, the ablation: drmas and pooled both weight every call and differ only in drmas's
# per-agent statistics, so drmas - pooled isolates them (pooled - grpo isolates the per-call weighting).
ABLATION = ("drmas", "pooled")
ABLATION_WHY = " drmas and pooled differ only in drmas's per-agent statistics."
LEVEL = 0.95
MARKERS = ["o", "s", "^", "v", "D", "P"]  # one per seed in a panel
# What may differ between a run and its baseline partner: the estimator itself, where it is written,
# and how far it went (the report caps every run at the same steps).
PAIR_IGNORED = ("algo.estimator", "log.run_dir", "steps")


class ValRun(Protocol):
    estimator: str
    seed: int
    config: dict[str, Any]
    val_rows: list[dict[str, Any]]


@dataclass(frozen=True)
class Interval:
    """Mean of `n` values and its two-sided t-interval (NaN bounds when n < 2)."""

    mean: float
    low: float
    high: float
    n: int


def t_quantile(p: float, df: int) -> float:
    """The `p`-quantile (0.5 < p < 1) of Student's t with `df` degrees of freedom.

    Bisection on the CDF, whose density is integrated with Simpson's rule: exact to ~1e-9, with no
    dependency beyond numpy.
    """
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"need 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x: float, intervals: int = 4000) -> float:
        grid = np.linspace(0.0, x, intervals + 1)
        dens = np.exp(log_c - (df + 1) / 2 * np.log1p(grid**2 / df))
        simpson = dens[0] + dens[-1] + 4 * dens[1:-1:2].sum() + 2 * dens[2:-1:2].sum()
        return 0.5 + x / intervals / 3 * simpson

    low, high = 0.0, 1.0
    while cdf(high) < p:
        low, high = high, 2 * high
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


def t_interval(values: Iterable[float], level: float = LEVEL) -> Interval:
    """Mean and two-sided `level` t-interval of the finite `values` (sample sd, n - 1 degrees of freedom)."""
    v = np.array([x for x in values if np.isfinite(x)], dtype=np.float64)
    if v.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(v.mean())
    if v.size < 2:
        return Interval(mean, math.nan, math.nan, 1)
    half = t_quantile(0.5 + level / 2, v.size - 1) * float(v.std(ddof=1)) / math.sqrt(v.size)
    return Interval(mean, mean - half, mean + half, int(v.size))


def paired_differences(a: Mapping[int, float], b: Mapping[int, float]) -> dict[int, float]:
    """`a[seed] - b[seed]` for the seeds both have with finite values, by seed."""
    return {s: a[s] - b[s] for s in sorted(set(a) & set(b)) if np.isfinite(a[s]) and np.isfinite(b[s])}


def curve(rows: Sequence[Mapping[str, Any]], key: str) -> dict[int, float]:
    """Step -> value of `key` over the rows that have it (a finite number)."""
    out = {}
    for row in rows:
        value = row.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out[int(row.get("step", 0))] = float(value)
    return out


def gain(values: Mapping[int, float], first: int, last: int) -> float:
    """`values[last] - values[first]`; NaN if either step is missing."""
    if first not in values or last not in values:
        return math.nan
    return values[last] - values[first]


def metric_keys(runs: Sequence[ValRun]) -> list[str]:
    """The headline validation metrics the runs logged: sampled avg@k, greedy avg@1, answer_acc."""
    found = {k for r in runs for row in r.val_rows for k in row}
    sampled = sorted(k for k in found if k.startswith("val/avg@") and k != "val/avg@1")
    return [k for k in ("val/avg@1", "val/answer_acc") if k in found] + sampled


def common_steps(runs: Sequence[ValRun], key: str) -> list[int]:
    """The validation steps at which every run logged `key`."""
    sets = [set(curve(r.val_rows, key)) for r in runs]
    return sorted(set.intersection(*sets)) if sets else []


def flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}}` -> `{"a.b": 1}`."""
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_diff(a: Mapping[str, Any], b: Mapping[str, Any], ignored: Sequence[str] = PAIR_IGNORED) -> list[str]:
    """The config fields (dotted) both runs have whose values differ, except `ignored`.

    A field only one run has was added to the trainer between the two runs; it is not counted, on the
    project's rule that a new field's default keeps the earlier behaviour: `one_sided` lists them.
    """
    fa, fb = flatten(a), flatten(b)
    return sorted(k for k in set(fa) & set(fb) if k not in ignored and fa[k] != fb[k])


def one_sided(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """The config fields (dotted) that only one of two runs has."""
    fa, fb = flatten(a), flatten(b)
    return sorted(set(fa) ^ set(fb))


def signed(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:+.3f}"


def interval_cell(iv: Interval) -> str:
    if iv.n < 2:
        return "n/a (n < 2)"
    return f"[{signed(iv.low)}, {signed(iv.high)}]"


def duplicates(runs: Sequence[ValRun]) -> list[str]:
    """Labels of (estimator, seed) pairs given by more than one run."""
    seen = [(r.estimator, r.seed) for r in runs]
    return [f"{e} s{s}" for e, s in sorted(set(seen)) if seen.count((e, s)) > 1]


def reading(iv: Interval) -> str:
    """Where the interval lies relative to 0: what the comparison can and cannot say."""
    if iv.n < 2:
        return "no interval (n < 2)"
    if iv.low > 0:
        return "above 0"
    if iv.high < 0:
        return "below 0"
    return "contains 0"


def span(runs: Sequence[ValRun], key: str) -> tuple[int, int] | None:
    """(first, last) validation step every run has for `key`; None with fewer than two."""
    steps = common_steps(runs, key)
    return (steps[0], steps[-1]) if len(steps) >= 2 else None


def gains_by_seed(runs: Sequence[ValRun], key: str, first: int, last: int) -> dict[str, dict[int, float]]:
    """Estimator -> seed -> gain of `key` from step `first` to step `last`."""
    out: dict[str, dict[int, float]] = {}
    for r in runs:
        out.setdefault(r.estimator, {})[r.seed] = gain(curve(r.val_rows, key), first, last)
    return out


def partners(
    runs: Sequence[ValRun], baseline: str, only: Sequence[str] | None = None
) -> tuple[dict[str, list[int]], list[str]]:
    """Per estimator, the seeds whose baseline run shares the config but for the estimator; notes on the rest.

    `only`: the estimators to pair (default: every one but the baseline). A note says why a run is not
    paired, or which fields of a paired run only one side's trainer version has.
    """
    base = {r.seed: r for r in runs if r.estimator == baseline}
    paired: dict[str, list[int]] = {}
    notes = []
    for r in runs:
        if r.estimator == baseline or (only is not None and r.estimator not in only):
            continue
        mate = base.get(r.seed)
        diff = config_diff(r.config, mate.config) if mate is not None else []
        if mate is None:
            notes.append(f"Not paired: {r.estimator} s{r.seed}: no {baseline} run with seed {r.seed}")
        elif diff:
            notes.append(
                f"Not paired: {r.estimator} s{r.seed}: config differs from {baseline} s{r.seed} in {', '.join(diff)}"
            )
        else:
            paired.setdefault(r.estimator, []).append(r.seed)
            if extra := one_sided(r.config, mate.config):
                notes.append(
                    f"Paired across trainer versions: {r.estimator} s{r.seed} and {baseline} s{r.seed}; "
                    f"fields only one of them has: {', '.join(extra)}"
                )
    return paired, notes


def protocol(runs: Sequence[ValRun]) -> list[str]:
    """What was validated, from the runs' `eval` config, and a warning where runs differ."""
    ev = runs[0].config.get("eval", {})
    n = max(curve(runs[0].val_rows, "val/n_problems").values(), default=math.nan)
    lines = [
        f"Validation (`eval` config of the runs): {fmt_count(n)} problems of split `{ev.get('split')}` "
        f"(the first of the order fixed by eval seed {ev.get('seed')}, the same for every run), "
        f"{ev.get('k')} samples each at temperature {ev.get('temperature')}, top-p {ev.get('top_p')} "
        "(`val/avg@k`: share of right team answers) and one greedy episode (`val/avg@1`; math envs: `val/answer_acc`, "
        "the Solver's last number is right, boxed or not). Step 0 is the initial weights.",
        "",
    ]
    differ = sorted({k for r in runs[1:] for k in config_diff({"eval": ev}, {"eval": r.config.get("eval", {})}, ())})
    if differ:
        lines += [f"**The runs' validation protocols differ** ({', '.join(differ)}): their figures do not compare.", ""]
    return lines


def fmt_count(x: float) -> str:
    return "?" if not np.isfinite(x) else str(int(x))


def curves_table(runs: Sequence[ValRun], keys: Sequence[str]) -> list[str]:
    """Per run and metric, the value at each validation step every run has."""
    steps = sorted({s for k in keys for s in common_steps(runs, k)})
    lines = ["| run | metric | " + " | ".join(f"step {s}" for s in steps) + " |", "|---" * (len(steps) + 2) + "|"]
    for r in runs:
        for key in keys:
            values = curve(r.val_rows, key)
            cells = [f"{values[s]:.3f}" if s in values else "n/a" for s in steps]
            lines.append(f"| {r.estimator} s{r.seed} | {key} | " + " | ".join(cells) + " |")
    return lines


BEHAVIOUR = ("val/valid/", "val/response_tokens/")  # per-agent validation keys, then the Verifier's approvals
APPROVALS = ("val/approve_right", "val/approve_wrong")


def behaviour_table(runs: Sequence[ValRun]) -> list[str]:
    """What each agent learned on the held-out set: per run, its first and last common validation value of
    every agent's well-formed share and reply length, and the Verifier's approvals of right / wrong attempts."""
    found = {k for r in runs for row in r.val_rows for k in row}
    keys = [k for prefix in BEHAVIOUR for k in sorted(found) if k.startswith(prefix)] + [
        k for k in APPROVALS if k in found
    ]
    spans = {k: s for k in keys if (s := span(runs, k))}
    if not spans:
        return []
    lines = [
        "### What each agent learned",
        "",
        "Held-out, first -> last validation step every run has: each agent's well-formed share (`val/valid/<agent>`) "
        "and reply length in tokens (`val/response_tokens/<agent>`); where the env grades the Verifier, how often it "
        "approved a right / a wrong attempt.",
        "",
        "| run | " + " | ".join(k.removeprefix("val/") for k in spans) + " |",
        "|---" * (len(spans) + 1) + "|",
    ]
    for r in runs:
        cells = []
        for key, (first, last) in spans.items():
            values = curve(r.val_rows, key)
            cells.append(f"{values[first]:.3g} -> {values[last]:.3g}")
        lines.append(f"| {r.estimator} s{r.seed} | " + " | ".join(cells) + " |")
    return lines


def _stat_row(label: str, key: str, steps: tuple[int, int], by_seed: Mapping[int, float]) -> str:
    iv = t_interval(by_seed.values())
    seeds = ", ".join(f"s{s} {signed(v)}" for s, v in sorted(by_seed.items()))
    return (
        f"| {label} | {key} | {steps[0]} -> {steps[1]} | {iv.n} | {seeds} | {signed(iv.mean)} "
        f"| {interval_cell(iv)} | {reading(iv)} |"
    )


STAT_HEAD = "| {} | metric | steps | n | per seed | mean | 95% t-interval | reading |"


def section(runs: Sequence[ValRun], baseline: str = BASELINE) -> str:
    """The report's "Held-out accuracy" section; empty when no run logged validation."""
    runs = [r for r in runs if r.val_rows]
    keys = metric_keys(runs)
    if not runs or not keys:
        return ""
    lines = ["## Held-out accuracy", "", *protocol(runs), "### Validation curves", "", *curves_table(runs, keys)]
    if learned := behaviour_table(runs):
        lines += ["", *learned]
    spans = {k: s for k in keys if (s := span(runs, k))}
    if not spans:
        lines += ["", "Fewer than two validation steps common to every run: no gains to report."]
        return "\n".join(lines) + "\n"
    lines += ["", *gains_lines(runs, spans), *paired_lines(runs, spans, baseline)]
    estimator, ablation_base = ABLATION
    if {estimator, ablation_base} <= {r.estimator for r in runs}:
        lines += paired_lines(runs, spans, ablation_base, only=[estimator], why=ABLATION_WHY)
    twice = duplicates(runs)
    if twice:
        lines += ["", f"**Several runs share an estimator and seed** ({', '.join(twice)}): statistics keep the last."]
    return "\n".join(lines) + "\n"


def gains_lines(runs: Sequence[ValRun], spans: Mapping[str, tuple[int, int]]) -> list[str]:
    """Per estimator and metric: the gains per seed, their mean and t-interval."""
    lines = [
        "### Gains over seeds",
        "",
        "Gain = a run's value at the last validation step every run has minus its value at the first. Mean over "
        f"seeds and a two-sided {LEVEL:.0%} t-interval (n - 1 degrees of freedom; n = seeds).",
        "",
        STAT_HEAD.format("estimator"),
        "|---" * 8 + "|",
    ]
    for key, steps in spans.items():
        for est, by_seed in sorted(gains_by_seed(runs, key, *steps).items()):
            lines.append(_stat_row(est, key, steps, by_seed))
    return lines


def paired_lines(
    runs: Sequence[ValRun],
    spans: Mapping[str, tuple[int, int]],
    baseline: str,
    only: Sequence[str] | None = None,
    why: str = "",
) -> list[str]:
    """Per estimator (`only`, default all) and metric: its gain minus the baseline's on the same seed, over seeds.

    `why`: a sentence added to the section's explanation (what the pairing isolates).
    """
    paired, notes = partners(runs, baseline, only)
    lines = []
    if paired:
        lines += [
            "",
            f"### Paired against {baseline}",
            "",
            f"Per seed, the estimator's gain minus {baseline}'s gain, for runs of the same seed whose configs are "
            f"equal but for the estimator (same data order and initial weights). Mean and t-interval over seeds.{why}",
            "",
            STAT_HEAD.format("comparison"),
            "|---" * 8 + "|",
        ]
    for key, steps in spans.items() if paired else ():
        gains = gains_by_seed(runs, key, *steps)
        for est, seeds in sorted(paired.items()):
            diffs = paired_differences({s: gains[est][s] for s in seeds}, gains[baseline])
            lines.append(_stat_row(f"{est} - {baseline}", key, steps, diffs))
    return lines + (["", *(f"{n}." for n in notes)] if notes else [])


def plot(runs: Sequence[ValRun], out: Path) -> list[str]:
    """heldout.png: per metric (rows), each estimator's seeds (thin) and mean (thick), then the means side by side."""
    runs = [r for r in runs if r.val_rows]
    keys = metric_keys(runs)
    if not runs or not keys:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    estimators = sorted({r.estimator for r in runs})
    color = {e: plt.get_cmap("tab10")(i) for i, e in enumerate(estimators)}
    cols = len(estimators) + 1
    fig, axes = plt.subplots(len(keys), cols, figsize=(3.6 * cols, 3 * len(keys)), squeeze=False)
    for row, key in zip(axes, keys):
        for ax, est in zip(row, estimators):
            mine = [r for r in runs if r.estimator == est]
            for r, marker in zip(mine, MARKERS * len(mine)):
                values = curve(r.val_rows, key)
                xy = (list(values), list(values.values()))
                ax.plot(*xy, marker=marker, lw=0.8, alpha=0.45, color=color[est], label=f"s{r.seed}")
            steps, mean = mean_curve(mine, key)
            ax.plot(steps, mean, "-", lw=2.5, color=color[est], label="mean")
            ax.set(title=f"{est}: {key} (seeds, mean)", xlabel="step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.legend(fontsize=6)
        for est in estimators:
            steps, mean = mean_curve([r for r in runs if r.estimator == est], key)
            row[-1].plot(steps, mean, "o-", color=color[est], label=est)
        row[-1].set(title=f"{key} (mean over seeds)", xlabel="step")
        row[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
        row[-1].legend(fontsize=6)
    fig.tight_layout()
    path = out / "heldout.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path.name]


def mean_curve(runs: Sequence[ValRun], key: str) -> tuple[list[int], list[float]]:
    """The mean over `runs` of `key` at the validation steps they all have."""
    steps = common_steps(runs, key)
    return steps, [float(np.mean([curve(r.val_rows, key)[s] for r in runs])) for s in steps]
