"""The learner's gain from shared prefixes: one saved batch of records replayed through the update.

    .venv/bin/python -m drmas_benchmarks.learner_sharing --collect runs/bench/records.json [--prompts 8 --group 4]
    .venv/bin/python -m drmas_benchmarks.learner_sharing --replay runs/bench/records.json [--repeats 3] [--micro 8]

`--collect` runs one real rollout of the default team (math-2agent, or `--env search-3agent`;
SmolLM2-135M-Instruct, fp32, the `cpu` preset's sampling and lengths, the vLLM backend by default)
and saves its call records (exact ids).
`--replay` loads them and times the learner's forward + backward over the whole batch
(`Learner.compute_gradients`, the update minus the optimizer step, which sharing does not touch) with
`learner.forward` = plain, shared_prefix and auto, each on a fresh copy of the model, one thread:
one warm-up, then the median of `repeats` timed passes, wall and CPU seconds of this process. It also
reports the tokens each strategy runs through the model (plain: the padded rows) and checks that the
gradients agree (largest per-tensor relative difference). The machine's load average is printed
beside the figures: other jobs share these cores.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import asdict
from pathlib import Path


def collect(path: Path, prompts: int, group: int, backend: str, env: str = "math-2agent") -> None:
    from drmas_train.algorithm.records import CallRecord
    from drmas_train.config import build_config
    from drmas_train.run.trainer import Trainer

    over = {"models.backend": backend, "rollout.prompts_per_step": prompts, "rollout.group_size": group}
    over["env.id"] = env
    over["log.run_dir"] = tempfile.mkdtemp(prefix="drmas-bench-")
    trainer = Trainer(build_config("cpu", over))
    try:
        batch = trainer.next_batch()  # step 1's batch, as the run rolls it out
    finally:
        trainer.close()
    keep = {f for f in CallRecord.__dataclass_fields__ if f not in ("extra",)}
    rows = [{k: v for k, v in asdict(r).items() if k in keep} for r in batch.records]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows))
    print(f"saved {len(rows)} records to {path}")


def replay(path: Path, repeats: int, micro: int) -> None:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from drmas_train.algorithm.records import CallRecord
    from drmas_train.engines.resolve import resolve_model
    from drmas_train.learner import Learner, PPOConfig
    from drmas_train.learner.adapters import chunk_by_adapter
    from drmas_train.learner.forward import choose_forward
    from drmas_train.learner.prefix_tree import tree_length

    torch.set_num_threads(1)
    records = [CallRecord(**row) for row in json.loads(path.read_text())]
    rng = np.random.default_rng(0)
    for r in records:  # advantages as the estimator would give: signs and sizes matter, values do not
        r.advantage = float(rng.standard_normal())
    by_agent: dict[str, list[int]] = {}
    for r in records:
        by_agent.setdefault(r.agent, []).append(len(r.prompt_ids))
    print(f"{len(records)} records; prompt tokens per agent (min-max):", end=" ")
    print({a: (min(v), max(v)) for a, v in by_agent.items()}, end="; ")
    lengths = [len(r.response_ids) for r in records]
    print(f"response tokens max {max(lengths)}, total {sum(lengths)}")
    model = AutoModelForCausalLM.from_pretrained(
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct"), dtype=torch.float32
    )
    results, grads = {}, {}
    for forward in ("plain", "shared_prefix", "auto"):
        m = copy.deepcopy(model)
        learner = Learner(m, PPOConfig(lr=1e-5, micro_batch_size=micro, forward=forward))
        chunks = chunk_by_adapter(records, range(len(records)), micro, by_prefix=forward != "plain")
        tokens = 0
        for c in chunks:
            mb = [records[i] for i in c]
            prompts, responses = [r.prompt_ids for r in mb], [r.response_ids for r in mb]
            if choose_forward(m, mb, forward) == "shared_prefix":
                tokens += tree_length(prompts, responses)
            else:
                tokens += len(mb) * (max(map(len, prompts)) + max(map(len, responses)))
        learner.compute_gradients(records)  # warm-up
        walls, cpus = [], []
        for _ in range(repeats):
            m.zero_grad(set_to_none=True)
            w0, c0 = time.perf_counter(), time.process_time()
            learner.compute_gradients(records)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        grads[forward] = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        results[forward] = (statistics.median(walls), statistics.median(cpus), tokens)
        print(
            f"{forward:14s} wall {results[forward][0]:7.2f} s  cpu {results[forward][1]:7.2f} s  tokens {tokens}  "
            f"load {os.getloadavg()[0]:.1f}"
        )
    worst = max(
        float((grads["shared_prefix"][n] - g).norm() / g.norm().clamp_min(1e-30)) for n, g in grads["plain"].items()
    )
    base = results["plain"]
    print(
        f"shared/plain: wall {results['shared_prefix'][0] / base[0]:.2f}x, "
        f"cpu {results['shared_prefix'][1] / base[1]:.2f}x, "
        f"tokens {results['shared_prefix'][2] / base[2]:.2f}x; auto/plain cpu {results['auto'][1] / base[1]:.2f}x; "
        f"largest per-tensor relative gradient difference {worst:.1e}"
    )
    print(f"CPU: {platform.processor() or platform.machine()}, torch threads 1, load average {os.getloadavg()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--collect", type=Path, help="run one rollout and save its records here")
    p.add_argument("--replay", type=Path, help="replay saved records through the learner")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--backend", default="vllm", help="the engine of --collect (vllm or transformers)")
    p.add_argument("--env", default="math-2agent", help="the env of --collect (the cpu preset's settings otherwise)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--micro", type=int, default=8, help="micro-batch size (the cpu preset's: 8)")
    args = p.parse_args()
    if args.collect:
        collect(args.collect, args.prompts, args.group, args.backend, args.env)
    if args.replay:
        replay(args.replay, args.repeats, args.micro)
    if not (args.collect or args.replay):
        p.error("give --collect and/or --replay")


if __name__ == "__main__":
    main()
