"""Closed choices are typed end to end: the config checks dtypes and devices when it is built, and the
functions that take a choice are annotated with the config's own type, not `str`."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

from drmas_train.algorithm.advantages import compute_advantages
from drmas_train.algorithm.group_stats import group_stats
from drmas_train.config import (
    Assignment,
    BackendName,
    ComputeDtype,
    Device,
    Estimator,
    Forward,
    GenDtype,
    HeadDtype,
    LossAgg,
    ModelDtype,
    ModelsConfig,
    PoolStrategy,
    RolloutRanks,
    Truncation,
    build_config,
    choices,
)
from drmas_train.engines import resolve_backend
from drmas_train.engines.assignment import load_model, make_backend, pick_device
from drmas_train.engines.loading import empty_model
from drmas_train.engines.settings import pick_gen_dtype, resolve_gen_dtype
from drmas_train.learner.distributed import join
from drmas_train.learner.forward import choose_forward, head_scores, score
from drmas_train.learner.layout import loss_denominator
from drmas_train.learner.precision import resolve_compute_dtype
from drmas_train.placement.pools import uses_engine_actors, worker_groups
from drmas_train.rollout.episodes import truncate


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:7"])
def test_a_device_of_the_stated_pattern_is_accepted(device):
    assert build_config("smoke", {"models.device": device}).models.device == device


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "CPU", "cpu:0", " cuda", "mps"])
def test_any_other_device_is_a_config_error(device):
    with pytest.raises(ValueError, match=r"models.device must be auto, cpu, cuda or cuda:N, got"):
        build_config("smoke", {"models.device": device})
    with pytest.raises(ValueError, match="models.device must be"):
        ModelsConfig(device=device)


def test_the_dtypes_are_the_names_accepted_today():
    assert choices(ModelDtype) == ("float32", "bfloat16", "float16")
    assert choices(GenDtype) == ("auto", *choices(ModelDtype))
    for dtype in choices(ModelDtype):
        assert build_config("smoke", {"models.dtype": dtype, "models.gen_dtype": dtype}).models.dtype == dtype
    assert build_config("smoke", {"models.gen_dtype": None}).models.gen_dtype is None
    for key in ("models.dtype", "models.gen_dtype"):
        with pytest.raises(ValueError, match=rf"{key} must be one of"):
            build_config("smoke", {key: "fp33"})
    with pytest.raises(ValueError, match="models.dtype must be one of"):
        ModelsConfig(dtype="auto")  # auto is for the generation engine only


@pytest.mark.parametrize(("key", "value"), [("models.dtype", "fp33"), ("models.device", "gpu:0")])
def test_the_cli_rejects_a_bad_dtype_or_device_in_one_line_naming_the_field(key, value):
    out = subprocess.run(
        [sys.executable, "-m", "drmas_train", "--set", f"{key}={value}", "--print-config"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    assert out.returncode == 2
    assert len(lines) == 1 and key in lines[0] and repr(value) in lines[0]


SIGNATURES = [
    (loss_denominator, "loss_agg", LossAgg),
    (resolve_compute_dtype, "requested", ComputeDtype),
    (pick_device, "device", Device),
    (load_model, "dtype", ModelDtype),
    (empty_model, "dtype", ModelDtype),
    (pick_gen_dtype, "requested", GenDtype | None),
    (pick_gen_dtype, "dtype", ModelDtype),
    (pick_gen_dtype, "backend", BackendName),
    (resolve_gen_dtype, "requested", GenDtype | None),
    (resolve_gen_dtype, "dtype", ModelDtype),
    (resolve_gen_dtype, "backend", BackendName),
    (resolve_backend, "name", BackendName),
    (make_backend, "kind", BackendName),
    (truncate, "side", Truncation),
    (choose_forward, "forward", Forward),
    (score, "forward", Forward),
    (score, "head_dtype", HeadDtype),
    (head_scores, "head_dtype", HeadDtype),
    (worker_groups, "assignment", Assignment),
    (uses_engine_actors, "backend", BackendName),
    (uses_engine_actors, "rollout_ranks", RolloutRanks),
    (compute_advantages, "estimator", Estimator),
    (group_stats, "estimator", Estimator),
    (join, "strategy", PoolStrategy),
]


@pytest.mark.parametrize(("func", "param", "alias"), SIGNATURES, ids=[f"{f.__name__}.{p}" for f, p, _ in SIGNATURES])
def test_a_function_that_takes_a_choice_is_typed_with_the_config_alias(func, param, alias):
    annotation = inspect.signature(func).parameters[param].annotation
    assert annotation != "str"
    assert eval(annotation, vars(sys.modules[func.__module__])) == alias  # the module's name is the config's type
