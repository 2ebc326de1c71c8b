"""Env speed: steps/s of the math envs without grading, and grades/s of the grader on one core.

    .venv/bin/python -m drmas_benchmarks.env_speed [--data ../shared/data] [--out benchmarks/results/env_speed.md]

The process (and so the grading worker it starts) is pinned to one core with sched_setaffinity.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import drmas_envs
from drmas_envs import run_lockstep
from drmas_envs.math.datasets import load_jsonl_tasks
from drmas_envs.math.grading import Grader

ROOT = Path(__file__).resolve().parents[2]
SOLUTION = "Let me think step by step. " * 20 + "So the answer is \\boxed{5}."
REVIEW = "Checking each step. " * 10


def no_grading(answer, reference):
    return False


def scripted(agent, idx, obs):
    if agent == "solver":
        return [SOLUTION] * len(idx)
    # alternate verdicts so half the episodes take the second Solver turn
    return [REVIEW + ("<verify>reject</verify>" if i % 2 else "<verify>approve</verify>") for i in idx]


def lockstep_steps_per_s(env_id: str, n_envs: int, repeats: int) -> tuple[float, float]:
    """Median (steps/s, episodes/s) of `repeats` runs of `n_envs` episodes in lock-step."""
    rates, episode_rates = [], []
    for r in range(repeats):
        envs = [drmas_envs.make(env_id, grader=no_grading) for _ in range(n_envs)]
        t0 = time.perf_counter()
        for i, env in enumerate(envs):
            env.reset(seed=r * n_envs + i)
        results = run_lockstep(envs, scripted)
        dt = time.perf_counter() - t0
        rates.append(sum(len(res.info["calls"]) for res in results) / dt)
        episode_rates.append(n_envs / dt)
    return statistics.median(rates), statistics.median(episode_rates)


def makes_per_s(env_id: str, n: int) -> float:
    drmas_envs.make(env_id)  # the first make generates and caches the dataset
    t0 = time.perf_counter()
    for _ in range(n):
        drmas_envs.make(env_id)
    return n / (time.perf_counter() - t0)


def single_env_steps_per_s(env_id: str, episodes: int) -> float:
    env = drmas_envs.make(env_id, grader=no_grading)
    steps = 0
    t0 = time.perf_counter()
    for ep in range(episodes):
        env.reset(seed=ep)
        for agent in env.agent_iter():
            _, _, term, trunc, _ = env.last()
            if term or trunc:
                env.step(None)
                continue
            obs = env.observe(agent)
            env.step(scripted(agent, [ep], [obs])[0])
            steps += 1
    return steps / (time.perf_counter() - t0)


def grades_per_s(pairs: list[tuple[str, str]], force_worker: bool = False) -> tuple[float, dict]:
    """Grades/s with a fresh grader (a cold parse cache in its worker), and its path counts."""
    grader = Grader()
    grade = grader.ask_worker if force_worker else grader.grade
    grade("\\sqrt{4}", "2")  # start the worker outside the timing
    t0 = time.perf_counter()
    for a, r in pairs:
        grade(a, r)
    rate = len(pairs) / (time.perf_counter() - t0)
    grader.close()
    return rate, ({"worker (forced)": len(pairs)} if force_worker else grader.stats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "env_speed.md"))
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    rows = []
    for env_id in ("math-1agent", "math-2agent"):
        steps, episodes = lockstep_steps_per_s(env_id, 256, 5)
        rows.append(
            (f"{env_id}, 256 envs in lock-step (median of 5)", f"{steps:,.0f} steps/s, {episodes:,.0f} episodes/s")
        )
        rows.append(
            (f"{env_id}, one env, plain AEC loop, 500 episodes", f"{single_env_steps_per_s(env_id, 500):,.0f} steps/s")
        )
        rows.append((f"{env_id}, `make()` (dataset cached)", f"{makes_per_s(env_id, 200):,.0f} makes/s"))
    math_dir = Path(args.data) / "math"
    gsm = load_jsonl_tasks(math_dir / "gsm8k_test.jsonl")
    m500 = load_jsonl_tasks(math_dir / "math500.jsonl")
    gsm_pairs = [(t["answer"], u["answer"]) for t, u in zip(gsm, gsm[1:] + gsm[:1])]
    m500_pairs = [(t["answer"], u["answer"]) for t, u in zip(m500, m500[1:] + m500[:1])]
    grade_rows = [
        ("gsm8k_test: other item's answer vs reference (1,319)", *grades_per_s(gsm_pairs)),
        ("math500: other item's answer vs reference (500)", *grades_per_s(m500_pairs)),
        ("math500: the same, math-verify worker forced (500)", *grades_per_s(m500_pairs, True)),
        (
            "math500: reference vs itself, math-verify worker forced (500)",
            *grades_per_s([(r, r) for _, r in m500_pairs], True),
        ),
    ]
    lines = [
        "# Env speed",
        "",
        f"`.venv/bin/python -m drmas_benchmarks.env_speed` on {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores visible, pinned to one core; Python {platform.python_version()}; "
        f"load average at the end {os.getloadavg()[0]:.1f} (the machine is shared, so figures vary run to run).",
        "Env steps use a constant grader (no grading) and scripted ~550-character outputs; a step is one agent call.",
        "",
        "| env | speed |",
        "|---|---|",
        *[f"| {name} | {rate} |" for name, rate in rows],
        "",
        "| grading, one core, a fresh grader per row | grades/s | path counts |",
        "|---|---|---|",
        *[f"| {name} | {rate:,.0f} | {stats} |" for name, rate, stats in grade_rows],
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
