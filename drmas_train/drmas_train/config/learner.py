"""`PPOConfig`: the optimisation knobs of one model's learner (the `learner` section of the config)."""

from __future__ import annotations

from dataclasses import dataclass

from drmas_train.config.choices import (
    BatchLayout,
    ComputeDtype,
    Forward,
    HeadDtype,
    LossAgg,
    OldLogprobs,
    ResidualDtype,
    check_choices,
)


@dataclass
class PPOConfig:
    """Optimisation knobs of one model's learner (paper values are the defaults unless noted)."""

    lr: float = 1e-6
    """AdamW learning rate, constant. Paper: 1e-6 for every agent; per-agent overrides go in param groups."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas. Paper: (0.9, 0.999)."""
    weight_decay: float = 0.01
    """AdamW decoupled weight decay. Paper: 0.01."""
    adam_eps: float = 1e-8
    """AdamW epsilon (torch default)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; the pre-clip norm is what gets logged. Paper: 1.0."""
    clip_low: float = 0.2
    """PPO lower ratio clip (1 - clip_low). Paper: 0.2."""
    clip_high: float = 0.2
    """PPO upper ratio clip (1 + clip_high); raise it (e.g. 0.28, DAPO) to let rare tokens grow. Paper: 0.2."""
    dual_clip: float | None = 3.0
    """Dual-clip cap c on negative advantages: bounds the loss of tokens whose ratio exploded. Paper: 3.0; None off."""
    kl_coef: float = 0.0
    """k3 KL-to-reference loss coefficient. Paper: 0 (off: no reference model is held in memory)."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (loss -= coef * token-mean entropy). Paper: 0 for math, 0.001 for search."""
    ppo_epochs: int = 1
    """Passes over the rollout batch per step. Paper: 1 (strictly on-policy; the ratio is then exactly 1)."""
    mini_batches: int = 1
    """Optimizer steps per epoch (batch_layout packed: the batch is shuffled and split; reference: verl's
    ppo_mini_update_num, mini-batches of ceil(records / (mini_batches x ranks)) per rank). Paper: 1 for math,
    5 for search."""
    micro_batch_size: int = 4
    """Sequences per forward/backward; lower it to save memory. With `loss_agg: token_mean` the gradient
    is the same whatever its value."""
    loss_agg: LossAgg = "token_mean"
    """How a mini-batch's token losses become one loss. token_mean: every response token of the mini-batch
    weighs the same (summed over micro-batches and ranks, divided by the mini-batch's token count), so the
    gradient does not depend on how it is cut into micro-batches or ranks. micro_token_mean (verl, the
    reference): a token-mean per micro-batch, averaged over the micro-batches (verl: divided by the
    accumulation steps, averaged over ranks): a token of a micro-batch of short replies weighs more than
    one of long replies, and the gradient norm changes with the micro-batch size (docs/gpus.md,
    "Loss aggregation"). The paper presets use micro_token_mean."""
    batch_layout: BatchLayout = "packed"
    """Which records share a rank, a mini-batch and a micro-batch (learner/layout.py). packed: the records are
    shuffled (seeded) into near-equal mini-batches, each cut into micro-batches of records sharing a prompt
    prefix (sorted by token ids; by length under forward plain) dealt round-robin to the ranks: the fewest
    tokens to compute, and with token_mean the gradient does not depend on the cut; the CPU presets use it,
    since with no reference run to match it does the least work. reference: verl's arithmetic inside a step
    (langfengQ/DrMAS): each model's records padded with copies of random ones (this run's seeded RNG) to a
    multiple of lcm(logprob_micro_batch_size, micro_batch_size) x ranks before advantages, so the copies
    count in the group statistics and are trained; equal-size length-balanced rank partitions; contiguous,
    unshuffled mini-batches of ceil(records / (mini_batches x ranks)) per rank, the last shorter; and under
    micro_token_mean each micro-batch divided by the floor mini // micro (a mini-batch whose last micro-batch
    is short weighs more or less than 1). The paper presets use reference; prefix-tree packing (forward)
    still runs inside each micro-batch."""
    logprob_micro_batch_size: int | None = None
    """Records per no-grad log-prob pass (old log-probs when the policy moves within an update); None:
    micro_batch_size. With batch_layout reference it also sets the copy-padding multiple. Reference (verl):
    rollout.log_prob_micro_batch_size_per_gpu (8 for math, 32 for search)."""
    old_logprobs: OldLogprobs = "recompute"
    """The PPO ratio's denominator: "recompute" (the learner's own pre-update log-probs, as verl), "sampled"
    (the records' sampling log-probs: the behaviour policy, so the ratio also corrects a sampler/learner
    mismatch or stale samples), or "decoupled" (AReaL's decoupled PPO for `rollout.max_staleness` >= 1: the
    ratio against the pre-update log-probs, each token weighted by pre-update / sampling probability)."""
    behaviour_weight_cap: float | None = 5.0
    """With old_logprobs decoupled: tokens whose weight pi_prox / pi_behaviour exceeds this are left out of the
    loss, so a token the engine sampled at a much lower probability than the learner now gives it cannot
    dominate (AReaL's behaviour-weight cap does the same). None: no cap. Not in the reference (synchronous)."""
    forward: Forward = "auto"
    """plain (a padded row per record), shared_prefix (a micro-batch packed as a prefix tree: each shared
    prompt prefix computed once, exact) or auto (shared_prefix when the tree saves a quarter of the tokens;
    its speed-up on replayed math and search batches: benchmarks/results/scaling_notes.md). Not in the
    reference (verl runs every sequence whole)."""
    logits_chunk_mib: float = 128.0
    """The LM head and log-softmax run on chunks of response positions whose fp32 logits fit in this many
    MiB (220 positions at Qwen's 151,936-token vocabulary, 682 at SmolLM2's 49,152); beyond one chunk,
    backward recomputes each chunk's logits instead of keeping them. Not in the reference (verl keeps them)."""
    compute_dtype: ComputeDtype = "float32"
    """Mixed precision: bfloat16 runs the forward and backward matmuls in bf16 (autocast) while the weights,
    gradients and AdamW state stay fp32 (master weights), as verl's FSDP mixed precision does; the LM head
    and log-softmax stay fp32, so log-probs keep fp32 resolution. auto: bfloat16 where bf16 matmul is
    native (a GPU with bf16, a CPU with AVX512_BF16 or AMX), float32 elsewhere (bf16 matmul is far slower
    than fp32 on AVX2-only CPUs: docs/measurements.md). float32 (the default): exact fp32. Moot when
    `models.dtype` is bfloat16 (the weights themselves are bf16, with no fp32 master). Reference (verl): bf16
    compute, fp32 master weights."""
    head_dtype: HeadDtype = "float32"
    """The LM head's matmul under bf16 compute: float32 (the default: logits, hence log-probs and PPO ratios,
    at fp32 resolution) or compute (bf16 like the body, as verl's mixed precision runs it: logits rounded to
    bf16, then the log-softmax in fp32, as the bf16 vLLM engine samples; faster where bf16 matmul is native:
    docs/measurements.md). No effect under fp32 compute.
    Reference (verl): compute."""
    residual_dtype: ResidualDtype = "float32"
    """The hidden states carried between decoder layers under bf16 compute: float32 (the default: the
    residual stream and each layer's saved input in fp32, as the master weights) or compute (bf16 from the
    embedding on, as verl's FSDP mixed precision runs it with bf16 parameters): with gradient checkpointing
    each layer's saved input takes half the memory, at bf16 rounding of the residual additions. No effect
    under fp32 compute. Reference (verl): compute."""
    tree_multiple: int = 1
    """Pad each packed prefix tree (`forward` shared_prefix) with masked tokens to a multiple of this many
    tokens; 1: no padding. Exact (padding is seen by nothing and scored by nothing), at up to
    tree_multiple - 1 tokens of compute a micro-batch; fewer distinct matmul shapes for oneDNN to build
    kernels for (benchmarks/results/learner_precision.md, "Page faults")."""
    compile_layers: bool = False
    """Run the decoder layers through torch.compile (inductor, dynamic shapes) in the learner's passes, so
    each layer's norms, rotary, activation and casts fuse into a few kernels (learner/compiled.py): faster
    updates after a compile in the first one, which a short run does not pay back, so the `cpu` preset leaves
    it off (docs/measurements.md). Needs a C++ compiler on CPU; not with gradient
    checkpointing or FSDP. Not in the reference (verl compiles its log-prob and entropy helpers only)."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward: one more forward pass per step, much less memory on long contexts."""
    optimizer_offload: bool = False
    """Keep AdamW's state in host memory between updates: it moves to the parameters' device before each
    update and back to the host after it, so the engines have that memory while they generate, at the cost
    of two copies of the state per step (on a CPU-only machine each move is a copy). Works alone, replicated
    and under FSDP (each rank moves its shard). Reference (verl): `fsdp_config.optimizer_offload=True`."""
    skip_zero_advantage: bool = False
    """Leave calls whose advantage is 0 out of the forward and backward passes. With kl_coef and entropy_coef
    at 0 such a call's tokens add nothing to the gradient (the PPO loss is the advantage times the ratio), so
    the update is the same to float rounding while the loss denominators still count their tokens; the token
    metrics (loss, entropy, clip_frac) then cover the trained calls only, and a mini-batch whose every call
    is 0 takes no optimizer step (AdamW would otherwise still move the weights by its momentum and weight
    decay). It saves the most when many groups hold one reward (GRPO gives all of them 0). Ignored under
    FSDP (every rank must run the same passes) and when kl_coef or entropy_coef is above 0. Not in the
    reference (verl trains every call)."""
    seed: int = 0
    """Seeds the mini-batch shuffle (only used when mini_batches > 1)."""

    def __post_init__(self) -> None:
        check_choices(self, "learner")
        if self.lr <= 0:
            raise ValueError(f"learner.lr must be > 0, got {self.lr}")
        if self.ppo_epochs < 1 or self.mini_batches < 1 or self.micro_batch_size < 1 or self.tree_multiple < 1:
            raise ValueError("ppo_epochs, mini_batches, micro_batch_size and tree_multiple must be >= 1")
        if self.logprob_micro_batch_size is not None and self.logprob_micro_batch_size < 1:
            raise ValueError(f"logprob_micro_batch_size must be >= 1 (or None), got {self.logprob_micro_batch_size}")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {self.clip_low}, {self.clip_high}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        if self.behaviour_weight_cap is not None and self.behaviour_weight_cap <= 1:
            raise ValueError(f"behaviour_weight_cap must be > 1 (or None), got {self.behaviour_weight_cap}")
        if self.grad_clip <= 0 or self.kl_coef < 0 or self.entropy_coef < 0 or self.logits_chunk_mib <= 0:
            raise ValueError("grad_clip and logits_chunk_mib must be > 0; kl_coef and entropy_coef >= 0")
        if self.compile_layers and self.gradient_checkpointing:
            raise ValueError("learner.compile_layers and learner.gradient_checkpointing cannot be combined")
        self.betas = tuple(self.betas)  # YAML gives lists
