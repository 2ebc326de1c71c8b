"""What a generation engine is built with on this machine: the model's context check and the engine dtype.

The engine's context (`max_model_len`) is checked twice at start-up, never at step N: against the run's
limits when the config is built (`drmas_train.config.train.resolve_max_model_len`), and here, against
the model's positions, when each model is built (`check_model_len`). `resolve_gen_dtype` turns
`models.gen_dtype: auto` into a dtype from the hardware.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from drmas_train.config import BackendName, GenDtype, ModelDtype

log = logging.getLogger(__name__)

NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
"""/proc/cpuinfo flags of x86 CPUs with bf16 matmul instructions (AVX512_BF16, AMX), where bf16 sampling pays."""


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


def pick_gen_dtype(
    requested: GenDtype | None, *, dtype: ModelDtype, backend: BackendName, native_bf16: bool
) -> ModelDtype | None:
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


def native_bf16(device_type: str) -> tuple[bool, str]:
    """Whether this machine's `device_type` ("cuda" or "cpu") multiplies bf16 natively, and why (for logs)."""
    if device_type == "cuda":
        import torch

        native = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return native, "GPU with bf16" if native else "GPU without bf16"
    found = sorted(set(NATIVE_BF16_CPU_FLAGS) & cpu_flags())
    return bool(found), f"CPU with {', '.join(found)}" if found else "CPU without AVX512_BF16 / AMX"


def resolve_gen_dtype(
    requested: GenDtype | None, *, dtype: ModelDtype, backend: BackendName, device_type: str
) -> ModelDtype | None:
    """`pick_gen_dtype` on this machine: a CUDA GPU with bf16 support, or a CPU with AVX512_BF16 / AMX.

    On such a CPU bf16 sampling is faster than fp32 (benchmarks/results/validation_cost.md); on a CPU
    without them bf16 matmul is far slower than fp32 (docs/measurements.md), so auto keeps `dtype` there, and a
    bf16 engine asked for by name (or recorded by a run resumed on another machine) is warned of.
    """
    if backend != "vllm" or requested not in ("auto", "bfloat16"):
        return pick_gen_dtype(requested, dtype=dtype, backend=backend, native_bf16=False)
    native, why = native_bf16(device_type)
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
