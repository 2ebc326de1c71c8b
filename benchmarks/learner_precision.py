"""The learner's mixed precision (`learner.compute_dtype`) against fp32 on one real batch of the default run.

    .venv/bin/python benchmarks/learner_precision.py --records runs/bench/records.json [--repeats 4]

The records are one real rollout of the `cpu` preset (math-2agent, SmolLM2-135M-Instruct, 8 prompts x 4,
its sampling and lengths), collected with `benchmarks/learner_sharing.py --collect` when the file does
not exist. Advantages are drawn from a standard normal (seed 0): their signs and sizes matter, not
their values. In one process, with the preset's learner settings (micro-batch 8, forward auto, the
preset's lr) and torch's default threads:
- update time: `Learner.update` (forward, backward, AdamW step) on a fresh copy of the weights, the
  settings alternating float32 / bfloat16 for `repeats` rounds after one warm-up each, median reported;
- gradient agreement: the gradient of the same loss on the same weights under each setting, cosine of
  the whole flattened gradient (in float64) and the largest per-tensor relative difference;
- log-prob agreement: the largest |log p_bf16 - log p_fp32| over the batch's response tokens.
Writes the figures to `--out` (JSON) and prints them with the CPU and the load average.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _records(path: Path):
    import numpy as np

    from drmas_train.records import CallRecord

    records = [CallRecord(**row) for row in json.loads(path.read_text())]
    rng = np.random.default_rng(0)
    for r in records:
        r.advantage = float(rng.standard_normal())
    return records


def _flat_grad(model):
    import torch

    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


def measure(records_path: Path, repeats: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from drmas_train.config import build_config
    from drmas_train.learner import Learner
    from drmas_train.models.resolve import resolve_model

    records = _records(records_path)
    base_cfg = build_config("cpu").learner
    model = AutoModelForCausalLM.from_pretrained(
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct"), dtype=torch.float32
    )
    settings = ("float32", "bfloat16")
    cfgs = {d: dataclasses.replace(base_cfg, compute_dtype=d) for d in settings}
    grads, logps, times = {}, {}, {d: [] for d in settings}
    for d in settings:  # gradients and log-probs on the same weights; doubles as the warm-up
        m = copy.deepcopy(model)
        learner = Learner(m, cfgs[d])
        logps[d] = learner.logprobs(records)
        learner.compute_gradients(records)
        grads[d] = _flat_grad(m)
        rel = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
        grads[d + "/tensors"] = rel
    for _ in range(repeats):
        for d in settings:
            learner = Learner(copy.deepcopy(model), cfgs[d])
            t = time.perf_counter()
            learner.update(records)
            times[d].append(time.perf_counter() - t)
    g32, g16 = grads["float32"], grads["bfloat16"]
    worst = max(
        float((grads["bfloat16/tensors"][n] - g).norm() / g.norm().clamp_min(1e-30))
        for n, g in grads["float32/tensors"].items()
    )
    dlogp = max(float((a - b).abs().max()) for a, b in zip(logps["float32"], logps["bfloat16"]) if len(a))
    med = {d: statistics.median(times[d]) for d in settings}
    return {
        "records": len(records),
        "response_tokens": sum(len(r.response_ids) for r in records),
        "update_s": {d: [round(t, 3) for t in times[d]] for d in settings},
        "update_s_median": {d: round(med[d], 3) for d in settings},
        "bf16_over_fp32": round(med["bfloat16"] / med["float32"], 3),
        "grad_cosine": float((g32.double() @ g16.double()) / (g32.double().norm() * g16.double().norm())),
        "grad_norm_ratio": float(g16.double().norm() / g32.double().norm()),
        "worst_tensor_rel_diff": worst,
        "max_abs_logp_diff": dlogp,
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=Path, default=Path("runs/bench/records.json"))
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/learner_precision.json"))
    args = p.parse_args()
    if not args.records.exists():
        from learner_sharing import collect

        collect(args.records, 8, 4, "vllm")
    from machine import cpu_line

    load_before = os.getloadavg()
    result = measure(args.records, args.repeats)
    result.update(machine=cpu_line(), load_before=load_before, load_after=os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
