"""Run the same seeds and data with several estimators, then report stability per model.

    .venv/bin/python -m drmas_benchmarks.stability.run --name controlled --preset smoke --steps 20 \\
        --estimators grpo,drmas,pooled,rloo --seeds 0,1 [--set key=value ...]

Every (estimator, seed) pair is one `drmas-train` run into `<runs-dir>/<name>/<estimator>-s<seed>`,
one after another (the models of a run are updated one after another too). Every run is started
with `--resume`, so a run whose metrics.jsonl already has `--steps` rows is not rerun and an
interrupted one continues from its last checkpoint (bit-identical to an uninterrupted run).
`--round-steps N` advances the runs in rounds of N steps (every run to N, then every run to 2N,
...), so a long benchmark stopped early still compares the estimators over the same steps;
`--report-only` just rebuilds the report, over each run's first `--steps` steps. The report (README.md with tables,
PNG plots) goes to `benchmarks/results/stability/<name>/`. Extra trainer settings go through
`--set section.field=value`, exactly as for `drmas-train`.

The report is built from an archive beside it, `<out>/runs/<estimator>-s<seed>/` (config.yaml and
metrics.jsonl, ~30 KB a run, committed with the report): each run with more steps than its archived copy
is copied there first. The run folders (checkpoints, GBs) stay outside the repository and may be gone
by the next session; the archive lets a clean checkout rebuild the report, and a later session add seeds
or estimators to it (`--report-only` with the full lists reports every archived run).

Held-out accuracy: every run validates (`drmas_train.run.validation`) before step 1 and every
`--eval-every` steps on the same held-out problems: the driver pins `eval.seed` (`--eval-seed`, the
same for every estimator and seed), so only the weights differ between two validations. The step-0
validation survives a resume (the trainer keeps rows up to its checkpoint and validates before
training only from step 0). The trainer also validates a run's last step, which in rounds is each
round's target: rounds of a multiple of `--eval-every` steps add no validations.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from drmas_benchmarks.stability.analysis import read_jsonl
from drmas_benchmarks.stability.report import write_report

ROOT = Path(__file__).resolve().parents[3]
ESTIMATORS = ("grpo", "drmas", "pooled", "rloo")


def train_command(
    args: argparse.Namespace, estimator: str, seed: int, run_dir: Path, steps: int | None = None
) -> list[str]:
    """The `drmas-train` command line of one run, trained up to `steps` (default `--steps`)."""
    cmd = [sys.executable, "-m", "drmas_train"]
    if args.preset:
        cmd += ["--preset", args.preset]
    if args.env:
        cmd += ["--env", args.env]
    steps = args.steps if steps is None else steps
    cmd += ["--estimator", estimator, "--seed", str(seed), "--steps", str(steps), "--run-dir", str(run_dir)]
    cmd += ["--resume"]
    for item in eval_overrides(args) + args.set:  # --set comes last, so it wins
        cmd += ["--set", item]
    return cmd


def round_targets(steps: int, round_steps: int | None) -> list[int]:
    """The step counts every run is brought to, one round after another: [steps] without rounds."""
    if not round_steps or round_steps >= steps:
        return [steps]
    return [*range(round_steps, steps, round_steps), steps]


def eval_overrides(args: argparse.Namespace) -> list[str]:
    """The `--set` items of the validation flags (only those given, but the eval seed always)."""
    given = {"every": args.eval_every, "n_problems": args.eval_problems, "k": args.eval_k, "seed": args.eval_seed}
    return [f"eval.{k}={v}" for k, v in given.items() if v is not None]


def trained_steps(run_dir: Path) -> int:
    """The last training step in the run's metrics.jsonl (its step-0 validation row is no step)."""
    metrics = run_dir / "metrics.jsonl"
    rows = read_jsonl(metrics) if metrics.is_file() else []
    return max((int(r.get("step", 0)) for r in rows), default=0)


def is_complete(run_dir: Path, steps: int) -> bool:
    return trained_steps(run_dir) >= steps


ARCHIVED = ("config.yaml", "metrics.jsonl")


def archive(run_dir: Path, copy: Path) -> bool:
    """Copy a run's config and metrics to `copy` when the run has more steps than the copy; True if copied."""
    if trained_steps(run_dir) <= trained_steps(copy) or not (run_dir / "config.yaml").is_file():
        return False
    if copy.is_symlink():  # a link to results committed elsewhere (cpu_default): never write through it
        copy.unlink()
    copy.mkdir(parents=True, exist_ok=True)
    for name in ARCHIVED:
        shutil.copyfile(run_dir / name, copy / name)
    return True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", required=True, help="benchmark name: runs/<name>, results/stability/<name>")
    p.add_argument("--preset", default=None, help="drmas-train preset (default: the trainer's cpu preset)")
    p.add_argument("--env", default=None, help="env id, e.g. math-2agent")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--estimators", default=",".join(ESTIMATORS))
    p.add_argument("--seeds", default="0")
    p.add_argument("--round-steps", type=int, default=None, help="advance every run by this many steps per round")
    p.add_argument("--eval-every", type=int, default=None, help="validate every N steps (default: the preset's)")
    p.add_argument("--eval-problems", type=int, default=None, help="held-out problems (default: the preset's)")
    p.add_argument("--eval-k", type=int, default=None, help="samples per held-out problem (default: the preset's)")
    p.add_argument("--eval-seed", type=int, default=0, help="fixes the held-out problems, the same for every run")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any trainer config field")
    p.add_argument("--runs-dir", default=str(ROOT / "runs" / "stability"))
    p.add_argument("--out", default=None, help="default: benchmarks/results/stability/<name>")
    p.add_argument("--report-only", action="store_true", help="only rebuild the report from existing runs")
    p.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    args = p.parse_args(argv)
    args.estimators = [e.strip() for e in args.estimators.split(",") if e.strip()]
    args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    unknown = set(args.estimators) - set(ESTIMATORS)
    if unknown:
        p.error(f"unknown estimators {sorted(unknown)}; choose from {ESTIMATORS}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs_root = Path(args.runs_dir) / args.name
    runs = [(e, s, runs_root / f"{e}-s{s}") for e in args.estimators for s in args.seeds]
    run_dirs = [d for _, _, d in runs]
    for target in round_targets(args.steps, args.round_steps):
        for estimator, seed, run_dir in runs:
            cmd = train_command(args, estimator, seed, run_dir, target)
            if args.dry_run:
                print(shlex.join(cmd))
                continue
            if args.report_only or is_complete(run_dir, target):
                continue
            run_dir.mkdir(parents=True, exist_ok=True)
            print(f"running {estimator} seed {seed} to step {target} -> {run_dir}", flush=True)
            with (run_dir / "train.log").open("a") as log:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
            if rc != 0:
                print(f"  failed (exit {rc}); see {run_dir / 'train.log'}", flush=True)
    if args.dry_run:
        return 0
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / "stability" / args.name
    copies = [out / "runs" / d.name for d in run_dirs]
    for run_dir, copy in zip(run_dirs, copies):
        if archive(run_dir, copy):
            print(f"archived {run_dir} -> {copy}", flush=True)
    done = [c for c in copies if trained_steps(c) >= 1]
    if not done:
        print("no finished runs to report on")
        return 1
    given = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--report-only"]
    command = ".venv/bin/python -m drmas_benchmarks.stability.run " + shlex.join(given)  # the command that ran them
    # the title names the results folder: one set of runs can feed several reports (--out)
    readme = write_report(done, out, title=f"Stability: {out.name}", command=command, max_steps=args.steps)
    print(f"report: {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
