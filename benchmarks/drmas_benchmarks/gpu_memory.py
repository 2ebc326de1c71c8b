"""The GPU check's memory part: the learner's device memory measured beside `drmas-train plan`'s figure.

On one GPU, with the paper presets' learner settings (fp32 master weights, bf16 compute, the LM head and
the hidden states between layers in bf16, gradient checkpointing), random weights of the check's shape cut
to `--memory-layers` decoder layers (the whole model with its fp32 AdamW state does not fit one 80 GB GPU,
as `plan` says), one micro-batch of full-length calls:
- start-up: the model built on the device in fp32 (one rank: nothing to shard);
- update: the peak of one `Learner.update` (weights, gradients, AdamW state, activations, logits);
- resident after it: what stays between updates, with the optimizer state on the device or offloaded
  (`learner.optimizer_offload`).
Each beside the plan's arithmetic for the same one-rank setting (`drmas_train.plan.memory.train_state`),
its ratio, or "OOM" where the device ran out (an out-of-memory the plan predicted is a valid result).
On a CPU (`--cpu-smoke`) the plan's figures are computed and the same code runs; there is no device
memory counter to read, so the measured column is empty.
"""

from __future__ import annotations

import gc
from typing import Any

GIB = 2**30


def arch_of(shape: dict[str, Any]):
    """The plan's `Arch` for a Qwen3 config's keyword arguments."""
    from drmas_train.plan.arch import Arch

    return Arch(
        family="qwen3",
        vocab_size=shape["vocab_size"],
        hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"],
        num_layers=shape["num_hidden_layers"],
        num_heads=shape["num_attention_heads"],
        num_kv_heads=shape["num_key_value_heads"],
        head_dim=shape["head_dim"],
        tie_word_embeddings=shape.get("tie_word_embeddings", True),
        max_position_embeddings=shape["max_position_embeddings"],
    )


def planned(shape: dict[str, Any], micro: int, prompt: int, response: int) -> dict[str, float]:
    """The plan's figures in GiB for one rank: start-up, update peak, resident with and without offload."""
    from drmas_train.plan.memory import train_state

    state = train_state(
        arch_of(shape),
        dtype=4,
        tokens=micro * (prompt + response),
        response_tokens=micro * response,
        checkpointing=True,
        chunk_mib=128.0,
        compute=2,
        residual=2,
    )
    update = state.weights + state.gradients + state.optimizer + state.activations + state.logits
    return {
        "startup": state.weights / GIB,
        "update": update / GIB,
        "resident": (state.weights + state.optimizer) / GIB,
        "resident_offloaded": state.weights / GIB,
    }


def memory_rows(args, shape: dict[str, Any], device: str, pad_token_id: int) -> list[dict[str, Any]]:
    """Measure (on CUDA) and plan the learner's memory; one row per figure (module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from drmas_train.algorithm.records import CallRecord
    from drmas_train.learner import Learner, PPOConfig

    layers = min(args.memory_layers or shape["num_hidden_layers"], shape["num_hidden_layers"])
    cut = dict(shape, num_hidden_layers=layers)
    plan = planned(cut, args.micro_batch, args.prompt_tokens, args.response_tokens)
    cuda = device == "cuda"
    measured: dict[str, float | str | None] = dict.fromkeys(plan)

    def peak_of(fn) -> tuple[Any, float | str | None]:
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        try:
            out = fn()
        except torch.OutOfMemoryError:
            return None, "OOM"
        if cuda:
            torch.cuda.synchronize()
        return out, torch.cuda.max_memory_allocated() / GIB if cuda else None

    def resident() -> float | None:
        return torch.cuda.memory_allocated() / GIB if cuda else None

    gc.collect()
    base = resident() or 0.0

    def build():
        with torch.device(device):
            return AutoModelForCausalLM.from_config(Qwen3Config(**cut), dtype=torch.float32)

    model, measured["startup"] = peak_of(build)
    gen = torch.Generator().manual_seed(0)
    length = args.prompt_tokens + args.response_tokens
    records = []
    for i in range(args.micro_batch):
        ids = torch.randint(3, cut["vocab_size"], (length,), generator=gen).tolist()
        prompt, reply = ids[: args.prompt_tokens], ids[args.prompt_tokens :]
        records.append(CallRecord(0, i, "solver", "m", 0, prompt, reply, [0.0] * len(reply), advantage=(-1.0) ** i))
    if model is not None:
        for offload in (False, True):
            cfg = PPOConfig(
                lr=1e-6,
                micro_batch_size=args.micro_batch,
                gradient_checkpointing=True,
                compute_dtype="bfloat16",
                head_dtype="compute",
                residual_dtype="compute",
                optimizer_offload=offload,
            )
            learner = Learner(model, cfg, name="m", pad_token_id=pad_token_id)
            _, peak = peak_of(lambda learner=learner: learner.update(records))
            if not offload:
                measured["update"] = peak
            measured["resident_offloaded" if offload else "resident"] = (
                "OOM" if peak == "OOM" else None if resident() is None else resident() - base
            )
            del learner
            model.zero_grad(set_to_none=True)
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    rows = []
    for key, figure in plan.items():
        got = measured[key]
        ratio = got / figure if isinstance(got, float) and figure > 0 else None
        rows.append({"memory": key, "layers": layers, "plan_gib": figure, "measured_gib": got, "ratio": ratio})
    return rows


def memory_table(rows: list[dict[str, Any]]) -> list[str]:
    """The memory rows as table lines."""
    if not rows:
        return []
    lines = [f"learner memory, one rank, {rows[0]['layers']} layers: {'figure':<20}{'plan GiB':>10}{'measured':>10}"]
    for r in rows:
        got = r["measured_gib"]
        shown = f"{got:>10.2f}" if isinstance(got, float) else f"{got or '-':>10}"
        ratio = f"  x{r['ratio']:.2f}" if r["ratio"] else ""
        lines.append(f"{'':<38}{r['memory']:<20}{r['plan_gib']:>10.2f}{shown}{ratio}")
    return lines
