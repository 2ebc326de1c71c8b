"""`TrainConfig`: a whole run's configuration, and the engine context its limits need.

The engine's context (`models.engine.max_model_len`) is derived from the run's own limits, the prompt
cap plus the largest response cap (the rollout's or any agent's), when the config is built; a value set
below that is an error then, not at step N. (Each model's own positions are checked when it is built:
`drmas_train.engines.settings.check_model_len`.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from drmas_train.config.eval import EvalConfig
from drmas_train.config.learner import PPOConfig
from drmas_train.config.placement import PlacementConfig
from drmas_train.config.sections import AgentOverrides, AlgoConfig, EnvConfig, LogConfig, ModelsConfig, RolloutConfig


@dataclass
class TrainConfig:
    """A whole run: the top-level fields and one field per section (`drmas-train --help-config`)."""

    reference: str | None = None
    """The experiment a paper preset reproduces: the reference repository, commit and script, e.g.
    "langfengQ/DrMAS@19c632b examples/drmas_trainer/run_math.sh"; None for the project's own presets.
    A preset with a reference must name its train and validation data (checked when the config is built)."""
    reproduces: str | None = None
    """What a run with a `reference` reproduces of it, exactly: the row of the reference README's compute table
    it stands for (models, GPUs) and every change from that row and the script (a model variant, the GPU
    layout). `drmas-train plan` prints it. Required with `reference`."""
    steps: int = 30
    """Training steps (one rollout batch and one update of every model per step); see `epochs`."""
    epochs: float | None = None
    """Passes over the training data instead of a step count, as the reference counts its runs (2 epochs of
    math, 1 of search): the run's steps become epochs x floor(training tasks / rollout.prompts_per_step)
    when the data is loaded (each pass drops its last partial batch, as the reference's loader does; a
    fraction runs part of the last pass, rounded down to whole steps), and config.yaml records that number
    in `steps`. None: `steps` decides."""
    seed: int = 0
    """Seeds data order, sampling and initialisation."""
    threads: int = 0
    """torch CPU threads; 0 keeps torch's default (one per core)."""
    keep_freed_memory: bool = True
    """glibc only: freed memory stays in the process (no mmap for large blocks, no heap trimming), so each
    micro-batch reuses the last one's pages instead of page-faulting fresh ones: faster updates for a higher
    peak RSS (the process keeps its peak heap; docs/measurements.md gives both). Process-wide and permanent:
    set false when memory is short or the trainer shares its process with work that must give memory back."""
    max_grade_error_share: float = 0.1
    """The run stops (one line, exit status 5, checkpoints intact) when more than this share of a step's grades
    are errors: a reference answer the grader cannot parse, a grader exception, a grading worker that died
    twice (`grade/errors`); an over-budget answer (`grade/over_budget`) is the policy's and never counts.
    1.0: never stop."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The team's environment: which env, its options, and the format penalty."""
    models: ModelsConfig = field(default_factory=ModelsConfig)
    """Which model(s) the agents run on, how agents share them, and the generation engine."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How many episodes each step samples, and how (temperature, top-p, length caps)."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """The advantage estimator: Dr. MAS's agent-wise normalisation or a baseline."""
    learner: PPOConfig = field(default_factory=PPOConfig)
    """The PPO update of each model: AdamW, clipping, KL and entropy terms, batching (paper values)."""
    agents: dict[str, AgentOverrides] = field(default_factory=dict)
    """Per-agent overrides, e.g. agents.verifier.temperature=0.7."""
    log: LogConfig = field(default_factory=LogConfig)
    """What a run writes to its run dir (metrics, trajectories, TensorBoard) and how often it checkpoints."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Validation on held-out problems during training: val/avg@k, val/avg@1, val/answer_acc, ... (`validation`)."""
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    """Where the models run: none (this process), or Ray pools, shared or per_agent (`drmas_train.placement`)."""

    def __post_init__(self) -> None:
        if self.rollout.group_size < 1 or self.rollout.prompts_per_step < 1:
            raise ValueError("rollout.group_size and rollout.prompts_per_step must be >= 1")
        if self.steps < 0:
            raise ValueError("steps must be >= 0")
        if not 0.0 <= self.max_grade_error_share <= 1.0:
            raise ValueError(f"max_grade_error_share must be in [0, 1], got {self.max_grade_error_share}")
        if self.epochs is not None and self.epochs <= 0:
            raise ValueError(f"epochs must be > 0 (or null), got {self.epochs}")
        if self.rollout.max_staleness > 0 and self.learner.old_logprobs == "recompute":
            raise ValueError(
                f"rollout.max_staleness {self.rollout.max_staleness} trains on samples of older weights: set "
                "learner.old_logprobs to decoupled (AReaL's decoupled PPO) or sampled (the behaviour log-prob as "
                "the ratio's denominator); recompute would treat them as the current policy's"
            )
        if self.models.engine.sleep and (self.rollout.max_staleness > 0 or self.placement.rollout_pool is not None):
            raise ValueError(
                "models.engine.sleep wakes each engine with the learner's current weights around its own "
                "generation, beside the learner: it does not combine with rollout.max_staleness > 0 (the learner "
                "updates while engines generate) or placement.rollout_pool (engines on GPUs of their own)"
            )
        if self.reference is not None:
            check_names_its_data(self)
            if not self.reproduces:
                raise ValueError(f"a run with reference {self.reference!r} must say what it reproduces (`reproduces`)")
        resolve_max_model_len(self)  # the engines' context, from the prompt and response caps

    def agent(self, name: str) -> AgentOverrides:
        """The overrides of agent `name` (all None when it has none)."""
        return self.agents.get(name) or AgentOverrides()

    def template_kwargs(self, name: str) -> dict[str, Any]:
        """The chat-template variables of agent `name`'s calls (global, then the agent's own)."""
        return {**self.models.chat_template_kwargs, **(self.agent(name).chat_template_kwargs or {})}


def needed_model_len(cfg: TrainConfig) -> tuple[int, str]:
    """(tokens, why): the longest call a `TrainConfig` allows, the prompt cap plus the largest response cap."""
    caps = {"rollout.max_new_tokens": cfg.rollout.max_new_tokens}
    for agent, over in cfg.agents.items():
        if over is not None and over.max_new_tokens is not None:
            caps[f"agents.{agent}.max_new_tokens"] = over.max_new_tokens
    source, longest = max(caps.items(), key=lambda kv: kv[1])
    need = cfg.rollout.max_prompt_tokens + longest
    return need, f"rollout.max_prompt_tokens {cfg.rollout.max_prompt_tokens} + {source} {longest}"


def resolve_max_model_len(cfg: TrainConfig) -> None:
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


def check_names_its_data(cfg: TrainConfig) -> None:
    """A paper preset (one with a `reference`) trains and validates on named data, never the generated sets.

    Raises:
        ValueError: `env.kwargs.dataset` is unset, or validation is on and `eval.env_kwargs.dataset` is unset.

    """
    missing = []
    if not cfg.env.kwargs.get("dataset"):
        missing.append("env.kwargs.dataset")
    if cfg.eval.enabled and not cfg.eval.env_kwargs.get("dataset"):
        missing.append("eval.env_kwargs.dataset")
    if missing:
        raise ValueError(
            f"this run reproduces {cfg.reference!r} but {' and '.join(missing)} is unset: it would train or "
            "validate on generated problems; name the reference's data (docs/paper_runs.md)"
        )


def steps_per_epoch(n_tasks: int, prompts_per_step: int) -> int:
    """Whole batches in one pass over `n_tasks` tasks: the last partial batch is dropped, as the reference's
    data loader does (`drop_last=True`), so no batch mixes two passes.

    Raises:
        ValueError: fewer tasks than one batch.

    """
    if n_tasks < prompts_per_step:
        raise ValueError(
            f"the training data has {n_tasks} tasks, fewer than rollout.prompts_per_step {prompts_per_step}: "
            "a pass over the data cannot fill one batch"
        )
    return n_tasks // prompts_per_step


def steps_for_epochs(epochs: float, n_tasks: int, prompts_per_step: int) -> int:
    """Training steps of `epochs` passes: epochs x floor(n_tasks / prompts_per_step), the reference's count.

    A fractional `epochs` runs the whole passes and then the first part of the next one, rounded down to
    a whole step (at least one step in all): 1.5 epochs of 10 steps each is 15 steps, 0.25 of 10 is 2.
    """
    return max(1, math.floor(epochs * steps_per_epoch(n_tasks, prompts_per_step) + 1e-9))


def data_slot(position: int, n_tasks: int, prompts_per_step: int) -> tuple[int, int]:
    """(pass, offset): where the batch at data position `position` (tasks consumed so far) lies.

    A pass over the data holds `steps_per_epoch` whole batches; the tasks past them are not trained on
    in that pass (each pass is a new permutation, so a different tail is left out each time). A
    position that does not fall on a batch of its pass (a resume with another `prompts_per_step`) moves
    to the start of the next pass, so that no batch mixes two passes.
    """
    usable = steps_per_epoch(n_tasks, prompts_per_step) * prompts_per_step
    epoch, offset = divmod(position, usable)
    if offset + prompts_per_step > usable:
        epoch, offset = epoch + 1, 0
    return epoch, offset
