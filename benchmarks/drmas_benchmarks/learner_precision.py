"""The learner's mixed precision (`learner.compute_dtype`) against fp32 on one real batch of the default run.

    .venv/bin/python -m drmas_benchmarks.learner_precision --records runs/bench/records.json [--repeats 4]
    .venv/bin/python -m drmas_benchmarks.learner_precision --settings float32,bfloat16,bfloat16+compile \
        --out benchmarks/results/learner_compile.json
    .venv/bin/python -m drmas_benchmarks.learner_precision --keep-freed-memory \
        --settings float32,bfloat16,bfloat16+head,bfloat16+head+mb12 --out benchmarks/results/learner_head.json

The records are one real rollout of the `cpu` preset (math-2agent, SmolLM2-135M-Instruct, 8 prompts x 4,
its sampling and lengths), collected with `benchmarks/drmas_benchmarks/learner_sharing.py --collect` when the file does
not exist. Advantages are drawn from a standard normal (seed 0): their signs and sizes matter, not
their values. In one process, with the preset's learner settings (its micro-batch, forward auto, the
preset's lr) and torch's default threads:
- update time: `Learner.update` (forward, backward, AdamW step) on a fresh copy of the weights, the
  settings alternating for `repeats` rounds after one warm-up each, median reported. A setting is a
  `learner.compute_dtype`, with `+compile` for `learner.compile_layers` (its warm-up, the first pass,
  includes compiling, into an empty inductor cache: what a fresh machine pays once per run), `+head`
  for `learner.head_dtype: compute` and `+mbN` for a micro-batch of N (else the preset's, with the
  head in fp32);
- gradient agreement: the gradient of the same loss on the same weights under each setting against the
  first setting's, cosine of the whole flattened gradient (in float64) and the largest per-tensor
  relative difference;
- log-prob agreement: the largest |log p - log p_first| over the batch's response tokens;
- minor page faults per update (median): pages the kernel handed the process fresh, each zeroed
  (`--keep-freed-memory` applies the allocator policy `drmas-train` runs with, `drmas_train.learner.allocator`).
Writes the figures to `--out` (JSON) and prints them with the CPU and the load average.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path


def _records(path: Path):
    import numpy as np

    from drmas_train.algorithm.records import CallRecord

    records = [CallRecord(**row) for row in json.loads(path.read_text())]
    rng = np.random.default_rng(0)
    for r in records:
        r.advantage = float(rng.standard_normal())
    return records


def _flat_grad(model):
    import torch

    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


def _setting(base_cfg, setting: str):
    """DTYPE[+compile][+head][+mbN]: compute dtype, compiled layers, the head in the compute dtype, micro-batch N."""
    dtype, *extras = setting.split("+")
    changes = dict(compute_dtype=dtype, compile_layers=False, head_dtype="float32")
    for extra in extras:
        if extra == "compile":
            changes["compile_layers"] = True
        elif extra == "head":
            changes["head_dtype"] = "compute"
        elif extra.startswith("mb") and extra[2:].isdigit():
            changes["micro_batch_size"] = int(extra[2:])
        else:
            raise SystemExit(f"a setting is DTYPE[+compile][+head][+mbN], got {setting!r}")
    return dataclasses.replace(base_cfg, **changes)


def _cosine(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a @ b) / (a.norm() * b.norm()))


def measure(records_path: Path, repeats: int, settings: list[str]) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from drmas_train.config import build_config
    from drmas_train.engines.resolve import resolve_model
    from drmas_train.learner import Learner

    records = _records(records_path)
    base_cfg = build_config("cpu").learner
    model = AutoModelForCausalLM.from_pretrained(
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct"), dtype=torch.float32
    )
    cfgs = {s: _setting(base_cfg, s) for s in settings}
    grads, tensors, logps, first = {}, {}, {}, {}
    times: dict[str, list[float]] = {s: [] for s in settings}
    for s in settings:  # gradients and log-probs on the same weights; doubles as the warm-up
        m = copy.deepcopy(model)
        learner = Learner(m, cfgs[s])
        t = time.perf_counter()
        logps[s] = learner.logprobs(records)
        learner.compute_gradients(records)
        first[s] = time.perf_counter() - t
        grads[s] = _flat_grad(m)
        tensors[s] = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    faults: dict[str, list[int]] = {s: [] for s in settings}
    for _ in range(repeats):
        for s in settings:
            learner = Learner(copy.deepcopy(model), cfgs[s])
            f0, t = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
            learner.update(records)
            times[s].append(time.perf_counter() - t)
            faults[s].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    ref = settings[0]
    med = {s: statistics.median(times[s]) for s in settings}
    out = {
        "records": len(records),
        "response_tokens": sum(len(r.response_ids) for r in records),
        "settings": settings,
        "update_s": {s: [round(t, 3) for t in times[s]] for s in settings},
        "update_s_median": {s: round(med[s], 3) for s in settings},
        "first_pass_s": {s: round(first[s], 1) for s in settings},
        "update_page_faults_median": {s: int(statistics.median(faults[s])) for s in settings},
        f"over_{ref}": {s: round(med[s] / med[ref], 3) for s in settings},
        "grad_cosine": {s: _cosine(grads[ref], grads[s]) for s in settings},
        "grad_norm_ratio": {s: float(grads[s].double().norm() / grads[ref].double().norm()) for s in settings},
        "worst_tensor_rel_diff": {
            s: max(float((tensors[s][n] - g).norm() / g.norm().clamp_min(1e-30)) for n, g in tensors[ref].items())
            for s in settings
        },
        "max_abs_logp_diff": {
            s: max(float((a - b).abs().max()) for a, b in zip(logps[ref], logps[s]) if len(a)) for s in settings
        },
        "torch_threads": torch.get_num_threads(),
    }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=Path, default=Path("runs/bench/records.json"))
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/learner_precision.json"))
    p.add_argument("--settings", default="float32,bfloat16", help="comma-separated; the first is the reference")
    p.add_argument(
        "--keep-freed-memory", action="store_true", help="glibc keeps freed memory, as drmas-train does by default"
    )
    args = p.parse_args()
    if args.keep_freed_memory:
        from drmas_train.learner.allocator import keep_freed_memory

        keep_freed_memory()
    # compile into an empty cache, as a fresh machine would (the first pass's time includes it)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="drmas-inductor-"))
    if not args.records.exists():
        from drmas_benchmarks.learner_sharing import collect

        collect(args.records, 8, 4, "vllm")
    from drmas_benchmarks.machine import cpu_line

    load_before = os.getloadavg()
    result = measure(args.records, args.repeats, args.settings.split(","))
    result.update(machine=cpu_line(), load_before=load_before, load_after=os.getloadavg())
    result["keep_freed_memory"] = args.keep_freed_memory
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
