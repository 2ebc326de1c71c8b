"""`drmas-train --env search-2agent` starts from the search envs' CPU default (`cpu-search`), which trains."""

import json

import pytest

from drmas_train.cli.args import parse_train_args
from drmas_train.cli.main import _preset_for
from drmas_train.config import build_config, default_preset, load_preset
from drmas_train.run.trainer import Trainer


@pytest.mark.parametrize(
    "env_id, preset",
    [("search-1agent", "cpu-search"), ("search-2agent", "cpu-search"), ("search-3agent", "cpu-search"),
     ("math-2agent", "cpu"), (None, "cpu")],
)  # fmt: skip
def test_env_flag_picks_its_cpu_default(env_id, preset):
    args, overrides = parse_train_args(["--env", env_id] if env_id else [])
    assert _preset_for(args, overrides) == preset == default_preset(env_id)


@pytest.mark.parametrize("env_id", ["search-1agent", "search-2agent", "search-3agent"])
def test_every_search_env_keeps_the_defaults_env_options(env_id):
    args, overrides = parse_train_args(["--env", env_id])
    cfg = build_config(_preset_for(args, overrides), overrides)
    assert cfg.env.id == env_id and cfg.env.kwargs == load_preset("cpu-search")["env"]["kwargs"]
    assert cfg.env.kwargs["open_tags"] is True and "</search>" in cfg.rollout.stop


def test_math_options_still_dropped_for_a_search_env():
    assert build_config("cpu", {"env.id": "search-2agent"}).env.kwargs == {}


def test_the_search_default_trains_a_couple_of_steps(tmp_path):
    """The preset's env, options and stop strings with tiny shapes: the tiny in-process model, 2 steps."""
    tiny = {
        "models.name": "tiny-math",
        "models.backend": "transformers",
        "threads": 1,
        "steps": 2,
        "rollout.prompts_per_step": 2,
        "eval.n_problems": 2,
        "eval.k": 2,
        "eval.every": 2,
        "log.run_dir": str(tmp_path / "run"),
    }
    cfg = build_config("cpu-search", tiny)
    Trainer(cfg).train()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "reward/team" in r]
    assert [r["step"] for r in train] == [1, 2]
    val = [r for r in rows if "val/avg@2" in r]
    assert [r["step"] for r in val] == [0, 2]
    assert all("val/world-single-hop/avg@2" in r and "val/valid/search" in r for r in val)
    assert not any("val/world-multi-hop/avg@2" in r for r in val)  # the default trains and validates on single hops
    for agent in ("search", "answer"):
        assert all(f"groups/{agent}/zero_var_share" in r for r in train)
