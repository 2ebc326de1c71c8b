"""GPU check: one preset-shaped step of a Qwen3-4B-shaped model on one GPU, against its floor.

    bash scripts/gpu_check.sh                      # on a GPU machine (docs/gpus.md, "The GPU check": measured figures)
    .venv/bin/python -m drmas_benchmarks.gpu_check --cpu-smoke   # the same code on CPU with a tiny model (CI)

No weights are downloaded: the model is Qwen3-4B's published shape (36 layers, hidden 2,560, 32 query
and 8 KV heads of 128, MLP 9,728, vocabulary 151,936, tied embeddings) with random weights made on the
device, and a word-level tokenizer over the whole vocabulary (so any sampled id decodes). The engine
is vLLM where it imports (random weights via `load_format="dummy"`, bf16, the math preset's engine
settings), else the transformers backend in bf16.

The step is the project's own code on one batch shaped like the math preset's calls (prompt and
response caps, micro-batch, gradient checkpointing, lr 1e-6): `backend.generate` -> `Learner.update`
(PPO, one optimizer step) -> `backend.load_weights` (the weight push). The floor is the same work
done with the libraries directly on the same batch: the engine's raw `generate` (no log-probs, no
seeds) and a plain forward/backward (cross-entropy on the response tokens, same micro-batches and
checkpointing) plus one AdamW step. The table prints seconds, tokens/s and peak device memory per
phase, and the step's ratio to the floor (1.0: no overhead over the libraries). Then the learner's memory
beside `drmas-train plan`'s figures (`drmas_benchmarks.gpu_memory`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from drmas_benchmarks.gpu_memory import memory_rows, memory_table
from drmas_train.plan.arch import KNOWN_ARCHS

ROOT = Path(__file__).resolve().parents[2]

# The math preset's model, from the shape table `drmas-train plan` uses (its config.json numbers), plus the
# two settings that do not change the shape.
QWEN3_4B = {**KNOWN_ARCHS["Qwen/Qwen3-4B"].hf_config_kwargs(), "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6}
TINY = dict(QWEN3_4B, vocab_size=2048, hidden_size=64, intermediate_size=256, num_hidden_layers=2)
TINY.update(num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=4096)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-smoke", action="store_true", help="tiny Qwen3-shaped model on CPU, short lengths (CI)")
    p.add_argument("--backend", choices=("auto", "vllm", "transformers"), default="auto")
    p.add_argument("--batch", type=int, default=None, help="calls in the step (default 8; cpu-smoke 4)")
    p.add_argument("--prompt-tokens", type=int, default=None, help="default 1024 (a first Solver call's problem)")
    p.add_argument("--response-tokens", type=int, default=None, help="default 4096, the math preset's cap")
    p.add_argument("--micro-batch", type=int, default=2, help="learner micro-batch (math preset: 4)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.25, help="math preset: 0.25 per engine")
    p.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs / compile (faster start)")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument(
        "--memory-layers",
        type=int,
        default=None,
        help="decoder layers of the memory part's fp32 model (default: 18 of Qwen3-4B's 36 on a GPU, whose whole "
        "fp32 model with AdamW does not fit beside the engine; all of the tiny one's); 0 skips the memory part",
    )
    args = p.parse_args(argv)
    small = args.cpu_smoke
    args.batch = args.batch or (4 if small else 8)
    args.prompt_tokens = args.prompt_tokens or (48 if small else 1024)
    args.response_tokens = args.response_tokens or (16 if small else 4096)
    if args.memory_layers is None:
        args.memory_layers = TINY["num_hidden_layers"] if small else 18
    return args


def write_model_folder(folder: Path, shape: dict[str, Any]) -> None:
    """A Qwen3 config and a word-level tokenizer over its whole vocabulary (no weights: vLLM's dummy load)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config

    config = Qwen3Config(**shape, eos_token_id=0, pad_token_id=1, bos_token_id=None)
    config.architectures = ["Qwen3ForCausalLM"]  # what vLLM builds
    config.save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(shape["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t2"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="t0", pad_token="t1", unk_token="t2")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(folder)


class Meter:
    """Wall time and peak device memory of one phase."""

    def __init__(self, device: str):
        self.device, self.rows = device, []

    def run(self, name: str, fn, tokens: int = 0) -> Any:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        out = fn()
        if self.device == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() / 2**30
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB -> GiB
        self.rows.append({"phase": name, "seconds": time.perf_counter() - t0, "tokens": tokens, "peak_gib": peak})
        return out


def engine_kind(choice: str) -> str:
    """vllm or transformers: "auto" is vllm where it imports."""
    if choice != "auto":
        return choice
    return "vllm" if importlib.util.find_spec("vllm") is not None else "transformers"


def build_engine(kind: str, args, folder: Path, tokenizer, model, device: str):
    """(backend, raw generate function) for the engine `kind`."""
    import torch

    if kind == "vllm":
        from drmas_train.config import EngineConfig
        from drmas_train.engines.vllm_backend import VLLMBackend

        engine = EngineConfig(
            max_model_len=args.prompt_tokens + args.response_tokens,
            gpu_memory_utilization=args.gpu_memory_utilization,
            kv_cache_gib=0.25 if device == "cpu" else None,
            enforce_eager=True if args.eager else None,
        )
        backend = VLLMBackend(folder, engine, dtype="bfloat16", load_format="dummy", tokenizer=tokenizer)

        def raw(prompts):
            from vllm import SamplingParams, TokensPrompt

            params = SamplingParams(temperature=1.0, max_tokens=args.response_tokens)
            outs = backend.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
            return sum(len(o.outputs[0].token_ids) for o in outs)

        return backend, raw
    from drmas_train.engines.transformers_backend import TransformersBackend

    backend = TransformersBackend(model, tokenizer, max_batch_size=args.batch)

    def raw(prompts):
        ids = torch.tensor(prompts, device=device)
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=args.response_tokens,
                do_sample=True,
                pad_token_id=tokenizer.pad_token_id,
            )
        return int((out[:, ids.shape[1] :] != tokenizer.pad_token_id).sum())

    return backend, raw


def raw_train(model, records, micro: int, lr: float, device: str) -> None:
    """The training floor: cross-entropy forward/backward on the responses, same micro-batches, one AdamW step."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    n_tokens = sum(len(r.response_ids) for r in records)
    for i in range(0, len(records), micro):
        chunk = records[i : i + micro]
        ids = torch.tensor([r.prompt_ids + r.response_ids for r in chunk], device=device)
        labels = ids.clone()
        labels[:, : len(chunk[0].prompt_ids)] = -100
        loss = model(input_ids=ids, labels=labels).loss * (labels[:, 1:] != -100).sum() / n_tokens
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build, run the step and the floor, and return the table's rows and the settings."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from drmas_train.algorithm.records import CallRecord
    from drmas_train.engines.base import SamplingParams
    from drmas_train.learner import Learner, PPOConfig

    device = "cpu" if args.cpu_smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run on a GPU machine, or pass --cpu-smoke")
    torch.manual_seed(0)
    shape = TINY if args.cpu_smoke else QWEN3_4B
    folder = Path(tempfile.mkdtemp(prefix="drmas-gpu-check-"))
    write_model_folder(folder, shape)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    meter = Meter(device)
    kind = engine_kind(args.backend)
    # vLLM: the presets' fp32 master weights beside a bf16 engine; transformers: one bf16 model (fp32 on CPU)
    learner_dtype = torch.bfloat16 if kind == "transformers" and device == "cuda" else torch.float32

    def make_model():
        with torch.device(device):  # random weights made on the device, no download
            return AutoModelForCausalLM.from_config(Qwen3Config(**shape), dtype=learner_dtype)

    if kind == "vllm":  # the engine first: vLLM sizes its KV cache from the memory it finds in use
        backend, raw_generate = meter.run(
            "setup: engine", lambda: build_engine(kind, args, folder, tokenizer, None, device)
        )
        model = meter.run("setup: model on device", make_model)
    else:  # the transformers engine serves the trained model itself
        model = meter.run("setup: model on device", make_model)
        backend, raw_generate = meter.run(
            "setup: engine", lambda: build_engine(kind, args, folder, tokenizer, model, device)
        )
    gen = torch.Generator().manual_seed(0)
    vocab = shape["vocab_size"]
    prompts = [torch.randint(3, vocab, (args.prompt_tokens,), generator=gen).tolist() for _ in range(args.batch)]
    sampling = [SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.response_tokens)] * args.batch
    backend.generate(prompts[:1], [SamplingParams(1.0, 1.0, 4)], seed=0)  # warm-up (kernels, graphs)

    gens = meter.run("step: generate", lambda: backend.generate(prompts, sampling, seed=0))
    meter.rows[-1]["tokens"] = sum(len(g.response_ids) for g in gens)
    records = [
        CallRecord(i // 2, i, "solver", "m", 0, g.prompt_ids, g.response_ids, g.logprobs, advantage=(-1.0) ** i)
        for i, g in enumerate(gens)
        if g.response_ids
    ]
    cfg = PPOConfig(lr=1e-6, micro_batch_size=args.micro_batch, gradient_checkpointing=True)
    learners = [Learner(model, cfg, name="m", pad_token_id=tokenizer.pad_token_id)]
    n_train = sum(len(r.prompt_ids) + len(r.response_ids) for r in records)
    update = meter.run("step: learner update", lambda: learners[0].update(records), tokens=n_train)
    meter.run("step: weight push", lambda: backend.load_weights(model.named_parameters()))

    learners.clear()  # its AdamW state: the floor's optimizer takes the same memory
    if hasattr(model, "gradient_checkpointing_disable"):  # the learner turned it on; generate uses the KV cache
        model.gradient_checkpointing_disable()
    model.eval()
    floor_gen = meter.run("floor: raw generate", lambda: raw_generate(prompts))
    meter.rows[-1]["tokens"] = floor_gen
    equal = [r for r in records if len(r.response_ids) == args.response_tokens]  # one width: no padding
    model.gradient_checkpointing_enable()
    model.train()
    meter.run(
        "floor: raw fwd/bwd/AdamW",
        lambda: raw_train(model, equal, args.micro_batch, 1e-6, device),
        tokens=sum(len(r.prompt_ids) + len(r.response_ids) for r in equal),
    )
    rows = meter.rows
    secs = {r["phase"]: r["seconds"] for r in rows}
    step = secs["step: generate"] + secs["step: learner update"] + secs["step: weight push"]
    # the training floor ran on the full-length records only: scale it to all of them
    train_floor = secs["floor: raw fwd/bwd/AdamW"] * (n_train / max(1, rows[-1]["tokens"]))
    floor = secs["floor: raw generate"] + train_floor
    return {
        "backend": kind,
        "device": device if device == "cpu" else torch.cuda.get_device_name(),
        "shape": "tiny Qwen3" if args.cpu_smoke else "Qwen3-4B",
        "batch": args.batch,
        "prompt_tokens": args.prompt_tokens,
        "response_tokens": args.response_tokens,
        "micro_batch": args.micro_batch,
        "rows": rows,
        "step_seconds": step,
        "floor_seconds": floor,
        "ratio": step / floor if floor > 0 else float("nan"),
        "grad_norm": update.get("grad_norm"),
    }


def table(result: dict[str, Any]) -> str:
    """The results as one plain-text table."""
    head = (
        f"GPU check: {result['shape']} on {result['device']}, backend {result['backend']}, "
        f"{result['batch']} calls x ({result['prompt_tokens']} prompt + {result['response_tokens']} response "
        f"tokens), micro-batch {result['micro_batch']}"
    )
    lines = [head, f"{'phase':<28}{'seconds':>10}{'tokens':>10}{'tokens/s':>12}{'peak GiB':>10}"]
    for r in result["rows"]:
        rate = r["tokens"] / r["seconds"] if r["tokens"] and r["seconds"] > 0 else 0.0
        rate_s = f"{rate:,.0f}" if rate else "-"
        tok_s = f"{r['tokens']:,}" if r["tokens"] else "-"
        lines.append(f"{r['phase']:<28}{r['seconds']:>10.2f}{tok_s:>10}{rate_s:>12}{r['peak_gib']:>10.2f}")
    lines.append(f"{'step (generate+update+push)':<28}{result['step_seconds']:>10.2f}")
    lines.append(f"{'floor (raw gen + raw train)':<28}{result['floor_seconds']:>10.2f}")
    lines.append(f"{'ratio step / floor':<28}{result['ratio']:>10.2f}")
    lines += memory_table(result.get("memory", []))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpu_smoke:
        import torch

        torch.set_num_threads(1)
    result = run(args)  # its model, engine and learner are freed on return: the memory part builds its own
    shape, device = (TINY, "cpu") if args.cpu_smoke else (QWEN3_4B, "cuda")
    result["memory"] = memory_rows(args, shape, device, pad_token_id=1) if args.memory_layers else []
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
