"""`drmas-train plan`'s memory model against measured peak RSS of a real learner update on CPU.

    .venv/bin/python -m drmas_benchmarks.plan_memory [--out benchmarks/results/plan_memory.md] [--only smollm2]

Each case runs in a fresh process: the resident set is read after the imports (the baseline), the
model is built (SmolLM2-135M-Instruct's real weights from the offline copy, or a Qwen2.5-0.5B-shaped
model randomly initialised from its published config: 494 M parameters), a `Learner` (the project's
own PPO update: old log-probs, forward, backward, clipping, AdamW) takes one update on an 8-token call
so AdamW's moments exist, as at every step after the first, and then one update on records of a fixed
shape in two micro-batches (gradients of the first micro-batch are alive while the second runs, as in
every multi-micro-batch step). The peak is the process's high-water mark (`VmHWM`, reset before the
model loads); the prediction is `drmas_train.plan.memory.train_state` for the same shape. glibc's
mmap threshold is fixed (`MALLOC_MMAP_THRESHOLD_`) so that freed tensors return to the OS, as the
model assumes; a default process may keep freed blocks for reuse and show more.
Writes a markdown report and a JSON file beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from drmas_benchmarks.machine import cpu_line

CASES = {
    "smollm2": dict(model="HuggingFaceTB/SmolLM2-135M-Instruct", prompt=192, response=192, micro=4, ckpt=False),
    "smollm2-ckpt": dict(model="HuggingFaceTB/SmolLM2-135M-Instruct", prompt=192, response=192, micro=4, ckpt=True),
    "qwen2.5-0.5b-bf16": dict(
        model="Qwen/Qwen2.5-0.5B-Instruct", prompt=128, response=128, micro=2, ckpt=False, dtype="bfloat16"
    ),
}
"""Name -> model and batch shape: records of `prompt` + `response` tokens, two micro-batches of `micro` records.
The 0.5B model trains in bf16 (weights, gradients, AdamW moments and activations at 2 bytes): its fp32 state
alone would be 7.9 GB (16 bytes per parameter), more than a shared development machine can spare safely;
bf16 also checks the model's dtype arithmetic (on a CPU with native bf16, AVX512_BF16)."""

CHILD = r"""
import json, sys, time
import torch
from drmas_train.learner import Learner, PPOConfig
from drmas_train.algorithm.records import CallRecord

case = json.loads(sys.argv[1])
torch.set_num_threads(case["threads"])
torch.manual_seed(0)

def rss_kib(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the high-water mark starts from here
before = rss_kib("VmRSS:")
if case["model"].startswith("HuggingFaceTB/"):
    from transformers import AutoModelForCausalLM
    from drmas_train.engines.resolve import resolve_model
    model = AutoModelForCausalLM.from_pretrained(resolve_model(case["model"]), dtype=torch.float32)
else:
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from drmas_train.plan.arch import Arch, known_arch
    a = Arch(**case["shape"]) if "shape" in case else known_arch(case["model"])
    config = Qwen2Config(vocab_size=a.vocab_size, hidden_size=a.hidden_size, intermediate_size=a.intermediate_size,
                         num_hidden_layers=a.num_layers, num_attention_heads=a.num_heads,
                         num_key_value_heads=a.num_kv_heads, tie_word_embeddings=a.tie_word_embeddings)
    model = Qwen2ForCausalLM(config).float()
model = model.to(getattr(torch, case.get("dtype", "float32")))
model.config._attn_implementation = "sdpa"
loaded = rss_kib("VmRSS:")
vocab = model.config.vocab_size

def record(i, n_prompt, n_response):
    g = torch.Generator().manual_seed(i)
    ids = torch.randint(0, vocab, (n_prompt + n_response,), generator=g).tolist()
    return CallRecord(0, i, "solver", "m", 0, ids[:n_prompt], ids[n_prompt:], [0.0] * n_response,
                      advantage=1.0 if i % 2 else -1.0, temperature=1.0)

ppo = PPOConfig(lr=1e-5, micro_batch_size=case["micro"], forward="plain", gradient_checkpointing=case["ckpt"])
learner = Learner(model, ppo)
learner.update([record(10_000, 4, 4)])  # AdamW's moments now exist, as at every step after the first
after_first = rss_kib("VmRSS:")
records = [record(i, case["prompt"], case["response"]) for i in range(2 * case["micro"])]
t = time.perf_counter()
metrics = learner.update(records)
print(json.dumps({"before": before, "loaded": loaded, "after_first": after_first, "peak": rss_kib("VmHWM:"),
                  "update_s": time.perf_counter() - t, "n_tokens": metrics["n_tokens"],
                  "n_params": sum(p.numel() for p in model.parameters())}))
"""


def predict(case: dict) -> dict[str, int]:
    """The plan's figures for one case (bytes)."""
    from drmas_train.plan.arch import Arch, known_arch
    from drmas_train.plan.memory import dtype_bytes, train_state

    arch = Arch(**case["shape"]) if "shape" in case else known_arch(case["model"])
    tokens = case["micro"] * (case["prompt"] + case["response"])
    state = train_state(
        arch,
        dtype=dtype_bytes(case.get("dtype", "float32")),
        tokens=tokens,
        response_tokens=case["micro"] * case["response"],
        checkpointing=case["ckpt"],
        chunk_mib=128.0,
    )
    parts = {k: getattr(state, k) for k in ("weights", "gradients", "optimizer", "activations", "logits")}
    return {**parts, "total": sum(parts.values()), "n_params": arch.n_params()}


SMALL_QWEN2 = dict(
    family="qwen2",
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1536,
    num_layers=4,
    num_heads=8,
    num_kv_heads=2,
    head_dim=64,
    tie_word_embeddings=True,
    max_position_embeddings=4096,
)
"""A 28 M-parameter random Qwen2 for a check that runs in a test (`benchmarks/tests/test_plan_memory.py`)."""


def measure(case: dict, threads: int) -> dict[str, float]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps({**case, "threads": threads})],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def gib(x: float) -> str:
    return f"{x / 2**30:.3f}"


def report(rows: list[dict], command: str, machine: str, loads: tuple[str, str]) -> str:
    lines = [
        "# Plan memory model vs measured peak RSS (CPU)",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine}; load average before / after: {loads[0]} / {loads[1]} (the 2 cores are shared "
        "with other engineers' jobs; memory figures do not depend on that, times do).",
        "",
        "Each case: a fresh process, fp32 unless named bf16, `forward: plain`, two micro-batches of `micro` records of "
        "`prompt + response` random tokens; measured = peak RSS (VmHWM) minus the RSS before the model loads. "
        "Predicted = weights + gradients + AdamW moments + one micro-batch's activations + LM-head chunk "
        "(`drmas_train.plan.memory`). GiB.",
        "",
        "| case | params | shape (micro x tokens) | ckpt | weights pred / meas | predicted total | measured peak | "
        "error | update s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        c, p, m = r["case"], r["predicted"], r["measured"]
        lines.append(
            f"| {r['name']} | {m['n_params'] / 1e6:.1f} M | {c['micro']} x {c['prompt'] + c['response']} | "
            f"{'on' if c['ckpt'] else 'off'} | {gib(p['weights'])} / {gib(m['loaded'] - m['before'])} | "
            f"{gib(p['total'])} | {gib(m['peak'] - m['before'])} | {r['error']:+.1%} | {m['update_s']:.0f} |"
        )
    lines += [
        "",
        "Predicted parts per case (GiB): "
        + "; ".join(
            f"{r['name']}: "
            + ", ".join(f"{k} {gib(v)}" for k, v in r["predicted"].items() if k not in ("total", "n_params"))
            for r in rows
        ),
        "",
        "The weights column is the resident set right after loading: SmolLM2's safetensors are memory-mapped "
        "and read lazily (most pages arrive with the first update); the 0.5 B model is built in fp32 and cast "
        "to bf16. The totals compare peaks, which include every part.",
        "",
        "The GPU-only parts of the plan (vLLM's KV cache and its engine share, FSDP sharding and gathers, "
        "CUDA context) are not measured here: they are projections.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="benchmarks/results/plan_memory.md")
    p.add_argument("--only", action="append", choices=list(CASES), help="run these cases only (repeatable)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    load_before = " ".join(f"{x:.1f}" for x in os.getloadavg())
    rows = []
    for name in args.only or list(CASES):
        case = CASES[name]
        t = time.perf_counter()
        measured = measure(case, args.threads)
        predicted = predict(case)
        peak = measured["peak"] - measured["before"]
        rows.append(
            {
                "name": name,
                "case": case,
                "measured": measured,
                "predicted": predicted,
                "error": predicted["total"] / peak - 1,
                "wall_s": time.perf_counter() - t,
            }
        )
        print(f"{name}: predicted {gib(predicted['total'])} GiB, measured {gib(peak)} GiB", file=sys.stderr)
    load_after = " ".join(f"{x:.1f}" for x in os.getloadavg())
    command = "python -m drmas_benchmarks.plan_memory " + " ".join(sys.argv[1:])
    text = report(rows, command.strip(), cpu_line(), (load_before, load_after))
    out = Path(args.out)
    out.write_text(text)
    out.with_suffix(".json").write_text(
        json.dumps(
            {"command": command.strip(), "machine": cpu_line(), "load": [load_before, load_after], "rows": rows},
            indent=2,
        )
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
