"""The training configuration: typed dataclasses, YAML presets and command-line overrides.

This package is the bottom of `drmas_train`'s import graph: it imports nothing else of the package and
no torch, so the CLI, tools and tests can build, check and print a config without loading a model.
Defaults are the paper's values where it states them (Feng et al., "Dr. MAS", arXiv 2602.08847, 2026)
and CPU-sized elsewhere; the presets live in `drmas_train/presets/*.yaml`.

Modules: `choices` (the `Literal` types of closed-choice fields), `sections` (env, models, rollout,
algo, agents, log), `engine`, `learner`, `placement`, `eval` (one section each), `train`
(`TrainConfig`), `loading` (presets, overrides, YAML), `help` (`--help-config`).
"""

from drmas_train.config.choices import (
    Assignment,
    BackendName,
    BatchLayout,
    ComputeDtype,
    Device,
    Estimator,
    Forward,
    GenDtype,
    HeadDtype,
    LossAgg,
    ModelDtype,
    OldLogprobs,
    PlacementMode,
    PoolStrategy,
    ResidualDtype,
    RolloutRanks,
    Truncation,
    check_choices,
    choices,
)
from drmas_train.config.engine import EngineConfig
from drmas_train.config.eval import EvalConfig
from drmas_train.config.learner import PPOConfig
from drmas_train.config.loading import (
    PRESET_DIR,
    ConfigSection,
    build_config,
    default_preset,
    from_dict,
    list_presets,
    load_preset,
    parse_assignment,
    save_config,
    set_dotted,
    to_dict,
)
from drmas_train.config.placement import PlacementConfig, PoolSize
from drmas_train.config.sections import (
    DEFAULT_MODEL,
    AgentOverrides,
    AlgoConfig,
    EnvConfig,
    LogConfig,
    ModelsConfig,
    RolloutConfig,
)
from drmas_train.config.train import (
    TrainConfig,
    data_slot,
    needed_model_len,
    resolve_max_model_len,
    steps_for_epochs,
    steps_per_epoch,
)

__all__ = [
    "DEFAULT_MODEL",
    "PRESET_DIR",
    "AgentOverrides",
    "AlgoConfig",
    "Assignment",
    "BackendName",
    "BatchLayout",
    "ComputeDtype",
    "ConfigSection",
    "Device",
    "EngineConfig",
    "EnvConfig",
    "Estimator",
    "EvalConfig",
    "Forward",
    "GenDtype",
    "HeadDtype",
    "LogConfig",
    "LossAgg",
    "ModelDtype",
    "ModelsConfig",
    "OldLogprobs",
    "PPOConfig",
    "PlacementConfig",
    "PlacementMode",
    "PoolSize",
    "PoolStrategy",
    "ResidualDtype",
    "Truncation",
    "RolloutConfig",
    "RolloutRanks",
    "TrainConfig",
    "build_config",
    "check_choices",
    "choices",
    "from_dict",
    "list_presets",
    "load_preset",
    "default_preset",
    "needed_model_len",
    "parse_assignment",
    "resolve_max_model_len",
    "save_config",
    "set_dotted",
    "steps_for_epochs",
    "steps_per_epoch",
    "data_slot",
    "to_dict",
]
