"""The learner's memory per model, by arithmetic over its architecture (`Arch`).

What one training process holds for a model it trains (bytes):
- weights: parameters x the learner's dtype;
- gradients: trainable parameters x dtype (freed after each optimizer step: `zero_grad(set_to_none=True)`);
- optimizer states: AdamW's two moments per trainable parameter, in the parameter's dtype (torch's);
- activations of one micro-batch: what autograd saves per token and layer (below), or with gradient
  checkpointing each layer's input plus one layer's recomputed activations;
- the LM head in backward: the learner scores response positions in chunks of `logits_chunk_mib` of fp32
  logits; a chunk's logits, log-softmax, softmax and gradient, and the head's and embedding's dense
  gradients before they are added into `.grad`, exist at once.

Saved per token and layer for a Llama/Qwen decoder layer (transformers' SDPA path with a mask, which
expands grouped K/V heads to every query head): the two RMSNorms' inputs and outputs (4 x hidden),
the rotated query, the expanded keys and values, the attention output and the `o_proj` input
(5 x heads x head_dim), and the MLP's gate, up, SiLU output and `down_proj` input (4 x intermediate).
The CPU check of these figures against measured peak RSS is `benchmarks/drmas_benchmarks/plan_memory.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from drmas_train.plan.arch import Arch

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
LOGITS_COPIES = 4
"""fp32 [chunk, vocabulary] tensors alive at once while backward recomputes and differentiates a chunk:
logits, log-softmax, softmax (entropy) and the gradient."""


def dtype_bytes(name: str | None) -> int:
    """Bytes per element of a dtype name (float32, bfloat16, ...).

    Raises:
        ValueError: an unknown dtype name.

    """
    key = (name or "float32").lower()
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}; known: {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


def lora_params(arch: Arch, rank: int, targets: list[str]) -> int:
    """Parameters of one LoRA adapter of `rank` on the named projections of every layer."""
    h, i = arch.hidden_size, arch.intermediate_size
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    shapes.update({"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)})
    return arch.num_layers * sum(rank * (a + b) for t, (a, b) in shapes.items() if t in targets)


def layer_activation_elems(arch: Arch) -> int:
    """Elements autograd saves per token in one decoder layer (module docstring)."""
    q = arch.num_heads * arch.head_dim
    return 4 * arch.hidden_size + 5 * q + 4 * arch.intermediate_size


def activation_bytes(
    arch: Arch, tokens: int, dtype: int, checkpointing: bool, compute: int | None = None, residual: int | None = None
) -> int:
    """Activations of a micro-batch of `tokens` tokens (prompt and response) at `dtype` bytes per element.

    Under mixed precision (`compute` bytes, e.g. 2 for bf16 autocast over fp32 weights) the matmuls' saved
    inputs and outputs are at `compute` bytes while the residual stream and the RMSNorms stay at `residual`
    bytes (`learner.residual_dtype`: `dtype`, or `compute` when the stream is carried in bf16).
    """
    compute = compute or dtype
    dtype = residual or dtype
    norms = 4 * arch.hidden_size
    per_layer = (norms * dtype + (layer_activation_elems(arch) - norms) * compute) * tokens
    if not checkpointing:
        return arch.num_layers * per_layer
    # Each layer keeps its input (the residual stream); backward recomputes one layer at a time.
    return arch.num_layers * arch.hidden_size * tokens * dtype + per_layer


def logits_bytes(arch: Arch, response_tokens: int, chunk_mib: float, dtype: int = 4) -> int:
    """The LM head's transient memory in backward: a chunk's fp32 logits (`LOGITS_COPIES` of them), and the
    head's and the embedding's [vocabulary, hidden] gradients before autograd adds them into `.grad`.
    """
    chunk = max(1, int(chunk_mib * 2**20) // (arch.vocab_size * 4))
    return (
        LOGITS_COPIES * min(response_tokens, chunk) * arch.vocab_size * 4
        + 2 * arch.vocab_size * arch.hidden_size * dtype
    )


@dataclass(frozen=True)
class TrainState:
    """One model's training memory on one rank, in bytes (see the module docstring)."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    logits: int
    gather: int = 0
    """FSDP only: the whole embedding/LM head and one layer (with its gradient) gathered at a time (a projection)."""

    @property
    def transient(self) -> int:
        """What exists only while this model trains: gradients, activations, logits, gathered shards."""
        return self.gradients + self.activations + self.logits + self.gather


def train_state(
    arch: Arch,
    *,
    dtype: int,
    tokens: int,
    response_tokens: int,
    checkpointing: bool,
    chunk_mib: float,
    trainable: int | None = None,
    shards: int = 1,
    compute: int | None = None,
    residual: int | None = None,
) -> TrainState:
    """The training memory of one model on one rank.

    Args:
        arch: the model's shape.
        dtype: bytes per element of the learner's weights (and of its activations and AdamW moments).
        tokens: tokens of the largest micro-batch (prompt and response, padding included).
        response_tokens: response positions of that micro-batch (the LM head scores these).
        checkpointing: whether gradient checkpointing is on.
        chunk_mib: `learner.logits_chunk_mib`.
        trainable: trainable parameters (LoRA adapters); None: every parameter.
        shards: FSDP ranks the weights, gradients and moments are sharded over (1: replicated).
        compute: bytes per element of the learner's matmuls under mixed precision (`learner.compute_dtype`);
            None: `dtype`. The bf16 copies of the weights that autocast makes (kept for backward) are
            counted with the activations.
        residual: bytes per element of the hidden states between layers (`learner.residual_dtype`); None: `dtype`.

    """
    n = arch.n_params()
    train = n if trainable is None else trainable
    held = n if trainable is None else n + trainable  # a LoRA model holds its frozen base and its adapters
    gather = (arch.embedding_params() + 2 * arch.layer_params()) * dtype if shards > 1 else 0
    return TrainState(
        weights=held * dtype // shards,
        gradients=train * dtype // shards,
        optimizer=2 * train * dtype // shards,
        activations=activation_bytes(arch, tokens, dtype, checkpointing, compute, residual)
        + (held * compute // shards if compute and compute < dtype else 0),
        logits=logits_bytes(arch, response_tokens, chunk_mib, dtype),
        gather=gather,
    )
