"""Tables of `drmas_benchmarks.step_efficiency`: per-row medians, the step's breakdown, the ratios, markdown.

Pure functions over the rows' JSON results (no torch), so the report can be rebuilt from a saved
`step_efficiency.json`:  .venv/bin/python -m drmas_benchmarks.step_efficiency_report results.json > out.md
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

STEP_ROWS = ("drmas-transformers", "drmas-vllm", "floor", "trl", "trl-gc")
"""Rows whose figures are training steps (wall, generate, update, other)."""
OTHER_PARTS = ("prompts", "env", "grading", "advantages", "metrics", "logging")
"""The parts of a drmas-train step that are neither generate nor update."""
TARGETS = (  # (what, numerator row, denominator row, key, at most)
    ("step vs the plain floor", "drmas-transformers", "floor", "wall", 0.75),
    ("step vs TRL", "drmas-transformers", "trl", "wall", 0.75),
    ("step vs TRL, checkpointing on", "drmas-transformers", "trl-gc", "wall", 0.75),
    ("peak RSS vs TRL with checkpointing on", "drmas-transformers", "trl-gc", "peak_rss_mb", 1.0),
    ("step (vLLM) vs the plain floor", "drmas-vllm", "floor", "wall", None),
    ("step (vLLM) vs TRL", "drmas-vllm", "trl", "wall", None),
)


def step_parts(step: dict[str, float]) -> dict[str, float]:
    """One step's wall split: generate, update, other, and (drmas-train) other's parts.

    drmas-train's parts come from the trainer's `time/*` keys: `env` is the rollout less generation,
    prompt building and grading; `logging` is what the step spent after the trainer's own clock stopped
    (metrics.jsonl, trajectories); `unaccounted` is what is left of `other`.
    """
    wall, gen, upd = step["wall"], step.get("time/generate", 0.0), step.get("time/update", 0.0)
    out = {"wall": wall, "generate": gen, "update": upd, "other": wall - gen - upd}
    if "time/step" in step:
        parts = {
            "prompts": step.get("time/prompts", 0.0),
            "grading": step.get("time/grading", 0.0),
            "advantages": step.get("time/advantages", 0.0),
            "metrics": step.get("time/metrics", 0.0),
            "logging": wall - step["time/step"],
            "sync": step.get("time/sync", 0.0),
        }
        parts["env"] = step["time/rollout"] - gen - parts["prompts"] - parts["grading"]
        parts["unaccounted"] = out["other"] - sum(parts[k] for k in OTHER_PARTS)
        out.update(parts)
    return out


def summarise(result: dict[str, Any]) -> dict[str, float]:
    """Medians over a row's timed steps of every part, with the row's peak RSS and step count."""
    steps = [step_parts(s) for s in result.get("steps", [])]
    out = {k: statistics.median(s[k] for s in steps) for k in (steps[0] if steps else {})}
    out["n"] = len(steps)
    if result.get("peak_rss_mb"):
        out["peak_rss_mb"] = float(result["peak_rss_mb"])
    return out


def ratios(summaries: dict[str, dict[str, float]]) -> list[tuple[str, str, float | None, float | None]]:
    """(what, rows, ratio or None when a row is missing, target) for each of `TARGETS`."""
    out = []
    for what, num, den, key, target in TARGETS:
        a, b = summaries.get(num, {}).get(key), summaries.get(den, {}).get(key)
        out.append((what, f"{num} / {den}", a / b if a is not None and b else None, target))
    return out


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _gb(mb: float | None) -> str:
    return "-" if not mb else f"{mb / 1024:.2f}"


def render(meta: dict[str, Any], results: dict[str, dict[str, Any]]) -> str:
    """The results file: header, step table, breakdown, validation/checkpoint rows, ratios, replay output."""
    sums = {row: summarise(r) for row, r in results.items() if "steps" in r}
    lines = [
        "# Step efficiency: drmas-train against the plain floor and TRL's GRPOTrainer",
        "",
        f"`{meta['command']}`, {meta['date']}, commit {meta['commit']}.",
        "",
        f"CPU: {meta['cpu']}, {meta['cores']} cores visible; torch threads {meta['threads']}. Load average "
        f"(1, 5, 15 min) at start {meta['load_start']}, at end {meta['load_end']}: other jobs on the machine "
        "show there and in each row's load column.",
        "",
        f"Setting: {meta['setting']}. Each figure is the median over the row's timed steps (the `n` column) "
        f"after {meta['warmup']} warm-up step(s); wall time is taken outside the trainer (the driver's clock "
        "around `train_step`; TRL: between consecutive `on_step_end` callbacks). Each row runs in a process "
        "of its own; peak RSS is the largest resident memory of that process and its children together, "
        "polled every 0.2 s.",
        "",
        "| row | s/step | generate | update | other | other % | peak RSS GB | n | load start-end |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for row in STEP_ROWS:
        r = results.get(row)
        if r is None:
            continue
        if "steps" not in r:
            notes.append(f"- {row}: {r.get('skipped') or 'failed: ' + str(r.get('error', '?'))}")
            continue
        s = sums[row]
        share = 100 * s["other"] / s["wall"] if s.get("wall") else None
        lines.append(
            f"| {row} | {_s(s.get('wall'))} | {_s(s.get('generate'))} | {_s(s.get('update'))} | {_s(s.get('other'))} "
            f"| {_s(share)} | {_gb(s.get('peak_rss_mb'))} | {s['n']} | {r['load_start']}-{r['load_end']} |"
        )
    lines += ["", *notes, ""] if notes else [""]
    lines += _breakdown(sums) + _single_rows(results, sums) + _ratio_lines(sums) + _replay(results)
    return "\n".join(lines).rstrip() + "\n"


def _breakdown(sums: dict[str, dict[str, float]]) -> list[str]:
    rows = [r for r in ("drmas-transformers", "drmas-vllm") if r in sums and "env" in sums[r]]
    if not rows:
        return []
    head = " | ".join(OTHER_PARTS)
    out = [
        "drmas-train's `other` (s, medians), from the trainer's `time/*` keys: prompts = chat template and "
        "tokeniser, env = the rollout less generation, prompts and grading, logging = metrics.jsonl and "
        "trajectories after the trainer's clock stops; sync (the weight push to the engine) is inside `update`.",
        "",
        f"| row | {head} | unaccounted | other % of step | sync (in update) |",
        "|---|" + "---|" * (len(OTHER_PARTS) + 3),
    ]
    for row in rows:
        s = sums[row]
        cells = " | ".join(f"{s[k]:.3f}" for k in OTHER_PARTS)
        out.append(
            f"| {row} | {cells} | {s['unaccounted']:.3f} | {100 * s['other'] / s['wall']:.2f} | {s['sync']:.3f} |"
        )
    return [*out, ""]


def _single_rows(results: dict[str, dict[str, Any]], sums: dict[str, dict[str, float]]) -> list[str]:
    rows = [r for r in results if r.startswith(("validate", "checkpoint"))]
    if not rows:
        return []
    out = ["| row | s (median) | n | what | peak RSS GB | load start-end |", "|---|---|---|---|---|---|"]
    for row in rows:
        r = results[row]
        if "steps" not in r:
            out.append(f"| {row} | - | - | {r.get('skipped') or 'failed: ' + str(r.get('error', '?'))} | - | - |")
            continue
        if row == "checkpoint":
            what = f"`Trainer.save`, {r['checkpoint_bytes'] / 1e6:,.1f} MB written (weights + AdamW state)"
        else:
            what = f"`Trainer.validate`: {r['n_problems']} problems x ({r['k']} samples + greedy)"
        s = sums[row]
        out.append(
            f"| {row} | {_s(s['wall'])} | {s['n']} | {what} | {_gb(s.get('peak_rss_mb'))} | "
            f"{r['load_start']}-{r['load_end']} |"
        )
    return [*out, ""]


def _ratio_lines(sums: dict[str, dict[str, float]]) -> list[str]:
    out = ["Ratios (the targets: step <= 0.75x the floor's and TRL's; RSS <= TRL's with checkpointing):", ""]
    for what, rows, value, target in ratios(sums):
        verdict = "" if value is None or target is None else (" (meets)" if value <= target else " (misses)")
        bound = "" if target is None else f", target <= {target}"
        out.append(f"- {what} ({rows}): {'-' if value is None else f'{value:.2f}x'}{bound}{verdict}")
    return [*out, ""]


def _replay(results: dict[str, dict[str, Any]]) -> list[str]:
    r = results.get("learner-replay")
    if r is None:
        return []
    text = r.get("output") or r.get("skipped") or f"failed: {r.get('error', '?')}"
    head = "The learner alone (`benchmarks/drmas_benchmarks/learner_sharing.py`, one saved batch replayed):"
    return [head, "", "```", text, "```", ""]


if __name__ == "__main__":
    saved = json.loads(Path(sys.argv[1]).read_text())
    sys.stdout.write(render(saved["meta"], saved["rows"]))
