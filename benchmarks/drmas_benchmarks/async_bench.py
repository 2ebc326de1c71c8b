"""Asynchronous training: wall time per step at rollout.max_staleness k = 0, 1, 2, and the pipeline model.

    nice -n 10 .venv/bin/python -m drmas_benchmarks.async_bench --preset cpu --steps 4 --reps 1
    .venv/bin/python -m drmas_benchmarks.async_bench --project          # the pipeline model on the paper presets only
    nice -n 10 .venv/bin/python -m drmas_benchmarks.async_bench --preset cpu --placed --no-project  # a rollout pool

Each run is `Trainer.train()` of the preset for `--steps` steps (validation off, checkpoints skipped:
the benchmark times steps), one process per run, the runs interleaved (k = 0, 1, 2, then again for each
rep) so that a change in the machine's load hits every k alike; same seed for all. The step time is
the wall time between two steps' ends, over the steps with the pipeline full: the first (filling it)
and the last k (no rollout beside their update) are left out, so `--steps` must be at least k + 2;
the whole run's time (`run_s`) is reported beside it. k = 0 runs also give
the per-phase times the pipeline model takes:

- generate: `time/rollout` of a synchronous step (sampling, envs, prompts);
- score: `time/advantages` + `time/metrics` (the driver's work between rollout and update);
- update: `time/update` - `time/sync`; push: `time/sync` (weights into the engines).

The pipeline model (`pipelined_step_s`): a synchronous step takes generate + score + update + push; with
k >= 1 a step takes max(generate, score + update) + push, each phase timed on the devices it is given
(the push waits for the batch in flight and the producer for the push). On a CPU both phases share the
cores: the model's no-contention time and the synchronous sum (full contention, no gain) bracket what a
run can do (`cpu_bounds`). On GPUs the split is real: `--project` takes `drmas-train plan`'s estimates
of the paper presets' rollout and learner times on r and 4 - r H100s (estimates, not measurements;
pushes not counted) and gives the projected speed-up of each split.
`--placed` times placed runs instead: placement shared, the learner pool 1 CPU and a rollout pool
(`placement.rollout_pool`) of 1 CPU beside it, on a local Ray each run starts; the engine then samples
in a process of its own while the learner updates in another, so with k >= 1 the two phases run on
their own cores (the push is inside `time/update` there: `time/sync` is 0).
Writes the raw figures as JSON to `--out` (default benchmarks/results/async.json, async_placed.json
with `--placed`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drmas_benchmarks.machine import cpu_line

RESULTS = Path(__file__).resolve().parents[1] / "results"

PAPER_PRESETS = ("math-2x-qwen3-4b", "search-shared-qwen2.5-7b", "search-3x-qwen2.5-3b")


@dataclass(frozen=True)
class Phases:
    """Seconds of each phase of one synchronous step, every phase with the whole machine's devices."""

    generate: float
    score: float
    update: float
    push: float


def sync_step_s(p: Phases) -> float:
    """A synchronous step: the phases one after another."""
    return p.generate + p.score + p.update + p.push


def pipelined_step_s(*, rollout: float, update: float, score: float, push: float) -> float:
    """A step with max_staleness >= 1: rollout (on its devices) beside score + update (on theirs), then the push.

    `rollout` and `update` are the phases' times on the devices each is given (all of them on a CPU);
    the push is serial with both (it waits for the batch in flight, and the next batch waits for it).
    """
    return max(rollout, score + update) + push


def cpu_bounds(p: Phases) -> tuple[float, float]:
    """(no-contention, full-contention) step times when both phases share one machine's cores.

    No contention: each phase runs as fast beside the other as alone. Full contention: the cores are
    busy throughout, so overlapping saves nothing (the synchronous sum).
    """
    return pipelined_step_s(rollout=p.generate, update=p.update, score=p.score, push=p.push), sync_step_s(p)


# ---- one measured run (in a process of its own) -------------------------------------------------------------


PLACED = {"placement.mode": "shared", "placement.shared_pool.cpus": 1, "placement.rollout_pool.cpus": 1}
"""`--placed`: one learner pool and one rollout pool of a CPU each."""


def one_run(preset: str, k: int, steps: int, backend: str | None, placed: bool = False) -> dict[str, Any]:
    """Train `steps` steps of `preset` at max_staleness `k`; per-step metrics and wall times between step ends.

    `placed`: on a learner pool beside a rollout pool (`PLACED`), in a local Ray started for the run.
    """
    from drmas_train.config import build_config
    from drmas_train.run.trainer import Trainer

    over: dict[str, Any] = {"steps": steps, "rollout.max_staleness": k, "eval.every": 0, "eval.before_train": False}
    over.update({"log.run_dir": tempfile.mkdtemp(prefix="drmas-async-"), "log.tensorboard": False})
    over["learner.old_logprobs"] = "decoupled" if k else "recompute"
    if backend:
        over["models.backend"] = backend
    if placed:
        over.update(PLACED)
    trainer = Trainer(build_config(preset, over))
    trainer.save = lambda: None  # the benchmark times steps, not checkpoints
    ends: list[float] = []
    start = time.perf_counter()
    rows = trainer.train(on_step=lambda _row: ends.append(time.perf_counter()))
    walls = [b - a for a, b in zip([start, *ends], ends)]
    keys = ("time/step", "time/rollout", "time/generate", "time/update", "time/sync", "time/advantages")
    keys += ("time/metrics", "time/prompts", "time/step_cpu", "rollout/staleness_mean", "tokens/generated")
    return {
        "k": k,
        "placed": placed,
        "backend": trainer.cfg.models.backend,
        "walls": walls,
        "rows": [{key: r.get(key) for key in keys} for r in rows],
    }


def phases_of(runs: list[dict[str, Any]]) -> Phases:
    """The mean per-phase times of the k = 0 runs' steps after the first."""
    rows = [r for run in runs if run["k"] == 0 for r in run["rows"][1:]]

    def mean(f) -> float:
        return sum(f(r) for r in rows) / len(rows)

    return Phases(
        generate=mean(lambda r: r["time/rollout"]),
        score=mean(lambda r: r["time/advantages"] + r["time/metrics"]),
        update=mean(lambda r: r["time/update"] - r["time/sync"]),
        push=mean(lambda r: r["time/sync"]),
    )


def load_line() -> str:
    return open("/proc/loadavg").read().strip() if os.path.exists("/proc/loadavg") else "unknown"


def measure(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    for rep in range(args.reps):
        for k in args.ks:
            cmd = [
                sys.executable,
                "-m",
                "drmas_benchmarks.async_bench",
                "--one",
                str(k),
                "--preset",
                args.preset,
                "--steps",
                str(args.steps),
            ]
            if args.backend:
                cmd += ["--backend", args.backend]
            if args.placed:
                cmd.append("--placed")
            before = load_line()
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                raise RuntimeError(f"run k={k} failed:\n{out.stderr[-3000:]}")
            run = json.loads(out.stdout.strip().splitlines()[-1])
            run.update(rep=rep, load_before=before, load_after=load_line())
            runs.append(run)
            steady = steady_walls(run)
            line = f"{sum(steady) / len(steady):.2f} s/step (steady steps)" if steady else "no steady step"
            print(f"rep {rep} k={k}: {line}, {sum(run['walls']):.1f} s in all, load {before}", flush=True)
    return {"cpu": cpu_line(), "preset": args.preset, "steps": args.steps, "placed": args.placed, "runs": runs}


VARIANTS = {
    "": {},  # the preset as shipped: bf16 compute over fp32 master weights (learner.compute_dtype: bfloat16)
    " fp32": {"learner.compute_dtype": "float32"},  # an fp32 learner
}
# bf16 weights (models.dtype) are not a variant: the plan's time model gives them the same bf16 peak.
"""The learner settings each preset is projected with (a suffix of its name: its overrides)."""


def plan_phases(preset: str, ranks: int, over: dict[str, Any]) -> tuple[float, float]:
    """(rollout s, learner s) per step of `preset` on a shared pool of `ranks` GPUs: `drmas-train plan`'s estimate."""
    from drmas_train.config import build_config
    from drmas_train.plan import build_plan

    over = {"placement.shared_pool.ranks": ranks, **over}
    est = build_plan(build_config(preset, over), preset=preset, offline=True, sample=16)["estimate"]
    return est["rollout_s_per_step"], est["learner_s_per_step"]


def project(presets=PAPER_PRESETS, devices: int = 4) -> dict[str, Any]:
    """The pipeline model on `drmas-train plan`'s H100 estimates of the paper presets (pushes not counted).

    Synchronous: rollout and learner each on all `devices` GPUs (the presets' shared pool). Pipelined:
    rollout on r GPUs, the learner on the other devices - r, each phase's time estimated by the plan at
    that many GPUs (decoding is memory-bound, so it does not scale linearly). Each learner setting of
    `VARIANTS`.
    """
    out: dict[str, Any] = {}
    for preset in presets:
        for suffix, over in VARIANTS.items():
            at = {r: plan_phases(preset, r, over) for r in range(1, devices + 1)}
            sync = Phases(generate=at[devices][0], score=0.0, update=at[devices][1], push=0.0)
            splits = {}
            for r in range(1, devices):
                t = pipelined_step_s(rollout=at[r][0], update=at[devices - r][1], score=0.0, push=0.0)
                splits[f"{r}/{devices - r}"] = round(sync_step_s(sync) / t, 2)
            out[preset + suffix] = {"sync_phases": sync.__dict__, "speedup_by_split": splits}
    return out


def steady_walls(run: dict[str, Any]) -> list[float]:
    """The step times of a run's full pipeline: without the first step (filling it) and the last k.

    With k >= 1 the last k steps have no rollout running beside their update (no later step to sample
    for), so they are faster than a long run's steps; counting them flatters k >= 1. A run needs at least
    k + 2 steps to have a steady one.
    """
    walls = run["walls"]
    return walls[1 : len(walls) - run["k"]]


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Per k: steady step time, whole-run time; the measured speed-ups and the model's CPU bounds."""
    steady: dict[int, list[float]] = {}
    total: dict[int, list[float]] = {}
    for run in result["runs"]:
        steady.setdefault(run["k"], []).extend(steady_walls(run))
        total.setdefault(run["k"], []).append(sum(run["walls"]))
    step = {k: sum(v) / len(v) if v else None for k, v in steady.items()}
    whole = {k: sum(v) / len(v) for k, v in total.items()}
    p = phases_of(result["runs"])
    best, worst = cpu_bounds(p)
    out = {"step_s": step, "run_s": whole, "phases": p.__dict__}
    out |= {"model_no_contention_s": best, "model_full_contention_s": worst}
    out["speedup"] = {k: step[0] / v if v else None for k, v in step.items()}
    out["run_speedup"] = {k: whole[0] / v for k, v in whole.items()}
    out["model_speedup_range"] = (1.0, sync_step_s(p) / best)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    ap.add_argument("--backend", default=None, help="models.backend override (default: the preset's)")
    ap.add_argument("--project", action="store_true", help="only the pipeline model on the paper presets")
    ap.add_argument("--no-project", action="store_true", help="only the measured runs (no projection)")
    ap.add_argument("--placed", action="store_true", help="a learner pool beside a rollout pool, 1 CPU each")
    ap.add_argument("--out", type=Path, default=None, help="default results/async.json (async_placed.json)")
    ap.add_argument("--resummarize", action="store_true", help="recompute the summary of --out's raw runs")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.out = args.out or RESULTS / ("async_placed.json" if args.placed else "async.json")
    if args.resummarize:
        result = json.loads(args.out.read_text())
        result["summary"] = summary(result)
        args.out.write_text(json.dumps(result, indent=1, default=float) + "\n")
        print(json.dumps(result["summary"], indent=1, default=float))
        return
    if args.one is not None:
        print(json.dumps(one_run(args.preset, args.one, args.steps, args.backend, args.placed)))
        return
    result: dict[str, Any] = {} if args.no_project else {"projection": project()}
    if not args.project:
        result.update(measure(args))
        result["summary"] = summary(result)
    args.out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1, default=float))


if __name__ == "__main__":
    main()
