"""The transformers backend against direct Hugging Face forwards on a real tiny model."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from drmas_train.engines.base import Backend, SamplingParams
from drmas_train.engines.resolve import resolve_model
from drmas_train.engines.transformers_backend import TransformersBackend


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    path = resolve_model("tiny-math")
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    return model, tok


def _prompts(tok):
    chats = [
        [{"role": "system", "content": "You are the Solver."}, {"role": "user", "content": "What is 3 + 4?"}],
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "You are the Verifier."}, {"role": "user", "content": "Check 2 + 2 = 5."}],
    ]
    return [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False) for c in chats]


def _direct_logprobs(model, prompt, response):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    logp = logits.log_softmax(-1)[len(prompt) - 1 : -1]
    return logp, logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_is_a_backend(tiny):
    assert isinstance(TransformersBackend(*tiny), Backend)


@pytest.mark.numerics
def test_greedy_equals_direct_argmax_and_logprobs_match(tiny):
    model, tok = tiny
    backend = TransformersBackend(model, tok)
    prompts = _prompts(tok)  # different lengths: exercises left padding
    assert len({len(p) for p in prompts}) == 3
    gens = backend.generate(prompts, [SamplingParams(temperature=0.0, max_new_tokens=10)] * 3)
    for prompt, gen in zip(prompts, gens):
        assert gen.prompt_ids == prompt
        assert 0 < len(gen.response_ids) <= 10
        logp, picked = _direct_logprobs(model, prompt, gen.response_ids)
        assert gen.response_ids == logp.argmax(-1).tolist()
        torch.testing.assert_close(torch.tensor(gen.logprobs), picked, atol=1e-4, rtol=0)


def test_sampled_logprobs_are_at_the_call_temperature(tiny):
    """log softmax(logits / T) of the sampled ids at top-p 1: the learner's quantity.

    At top-p < 1 they are renormalised over the nucleus, as vLLM's (test_temperature.py).
    """
    model, tok = tiny
    backend = TransformersBackend(model, tok)
    prompts = _prompts(tok)
    gens = backend.generate(prompts, [SamplingParams(temperature=0.5, top_p=1.0, max_new_tokens=12)] * 3, seed=1)
    for prompt, gen in zip(prompts, gens):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + gen.response_ids])).logits[0, len(prompt) - 1 : -1].float()
        tempered = torch.log_softmax(logits / 0.5, -1).gather(1, torch.tensor(gen.response_ids)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(gen.logprobs), tempered, atol=1e-4, rtol=0)
        _, raw = _direct_logprobs(model, prompt, gen.response_ids)
        assert (raw - tempered).abs().max() > 1e-2  # the check above can tell T = 0.5 from T = 1


def test_per_call_sampling_params_and_seed(tiny):
    model, tok = tiny
    backend = TransformersBackend(model, tok)
    prompts = _prompts(tok)
    mixed = [SamplingParams(0.0, 1.0, 6), SamplingParams(1.0, 1.0, 3), SamplingParams(0.0, 1.0, 9)]
    gens = backend.generate(prompts, mixed, seed=7)
    alone = backend.generate([prompts[2]], [SamplingParams(0.0, 1.0, 9)])
    assert gens[2].response_ids == alone[0].response_ids  # a greedy row is unaffected by its batch
    assert len(gens[1].response_ids) <= 3 and len(gens[0].response_ids) <= 6
    again = backend.generate(prompts, mixed, seed=7)
    assert [g.response_ids for g in again] == [g.response_ids for g in gens]


def test_eos_ends_a_response_and_is_kept(tiny):
    model, tok = tiny
    backend = TransformersBackend(model, tok)
    gens = backend.generate(_prompts(tok) * 4, [SamplingParams(1.0, 1.0, 24)] * 12, seed=0)
    stopped = [g for g in gens if g.finish_reason == "stop"]
    assert stopped, "the fitted tiny model ends some responses with EOS"
    for g in gens:
        eos_at = [i for i, t in enumerate(g.response_ids) if t in backend.eos]
        if g.finish_reason == "stop":
            assert eos_at == [len(g.response_ids) - 1]
        else:
            assert not eos_at and len(g.response_ids) == 24
        assert len(g.logprobs) == len(g.response_ids)


def test_lora_adapter_per_prompt(tiny):
    from peft import LoraConfig, get_peft_model

    base, tok = tiny
    model = AutoModelForCausalLM.from_pretrained(base.name_or_path)
    cfg = dict(target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=64, **cfg), adapter_name="alpha")
    peft_model.add_adapter("beta", LoraConfig(r=2, lora_alpha=64, **cfg))
    backend = TransformersBackend(peft_model, tok)
    prompt = _prompts(tok)[0]
    greedy = SamplingParams(0.0, 1.0, 8)
    mixed = backend.generate([prompt] * 3, [greedy] * 3, adapters=["alpha", "beta", None])
    for name, gen in zip(["alpha", "beta"], mixed[:2]):
        peft_model.set_adapter(name)
        _, picked = _direct_logprobs(peft_model, prompt, gen.response_ids)
        torch.testing.assert_close(torch.tensor(gen.logprobs), picked, atol=1e-4, rtol=0)
    with peft_model.disable_adapter():
        _, picked = _direct_logprobs(peft_model, prompt, mixed[2].response_ids)
    torch.testing.assert_close(torch.tensor(mixed[2].logprobs), picked, atol=1e-4, rtol=0)
    assert len({tuple(g.logprobs) for g in mixed}) == 3  # three different weight sets


def test_load_weights_changes_generation(tiny):
    model, tok = tiny
    copy = AutoModelForCausalLM.from_pretrained(model.name_or_path)
    backend = TransformersBackend(copy, tok)
    prompt = _prompts(tok)[:1]
    before = backend.generate(prompt, [SamplingParams(0.0, 1.0, 8)])[0]
    new = {n: p.detach() + 0.05 * torch.randn_like(p) for n, p in copy.named_parameters()}
    backend.load_weights(new.items())
    after = backend.generate(prompt, [SamplingParams(0.0, 1.0, 8)])[0]
    _, picked = _direct_logprobs(copy, prompt[0], after.response_ids)
    torch.testing.assert_close(torch.tensor(after.logprobs), picked, atol=1e-4, rtol=0)
    assert after.logprobs != before.logprobs
    with pytest.raises(KeyError, match="no parameter"):
        backend.load_weights([("nope.weight", torch.zeros(1))])


def _prefill_batch_sizes(model):
    """Record the batch size of every forward that starts from no cache (a prefill)."""
    sizes = []

    def hook(module, args, kwargs):
        if kwargs.get("past_key_values") is None:
            sizes.append(kwargs["input_ids"].shape[0])

    return sizes, model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.numerics
def test_shared_prefill_runs_each_distinct_prompt_once_and_changes_no_output(tiny):
    model, tok = tiny
    batch = [p for p in _prompts(tok) for _ in range(4)]  # GRPO: every prompt sampled 4 times
    shared, alone = TransformersBackend(model, tok), TransformersBackend(model, tok, share_prefill=False)
    sizes, handle = _prefill_batch_sizes(model)
    try:
        for params, seed in (([SamplingParams(0.0, 1.0, 12)] * 12, None), ([SamplingParams(1.0, 1.0, 12)] * 12, 3)):
            sizes.clear()
            fanned = shared.generate(batch, params, seed=seed)
            assert sizes == [3]  # three distinct prompts prefilled, not twelve
            plain = alone.generate(batch, params, seed=seed)
            assert sizes == [3, 12]
            assert [g.response_ids for g in fanned] == [g.response_ids for g in plain]
            for f, p in zip(fanned, plain):
                torch.testing.assert_close(torch.tensor(f.logprobs), torch.tensor(p.logprobs), atol=1e-5, rtol=0)
        # sampled rows of one prompt still differ (the fitted model has few likely answers per prompt)
        assert any(len({tuple(g.response_ids) for g in fanned[i : i + 4]}) > 1 for i in (0, 4, 8))
    finally:
        handle.remove()


@pytest.mark.numerics
def test_shared_prefill_keeps_adapters_apart(tiny):
    from peft import LoraConfig, get_peft_model

    base, tok = tiny
    cfg = LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(base.name_or_path), cfg, adapter_name="alpha")
    peft_model.add_adapter("beta", cfg)
    prompt = _prompts(tok)[0]
    adapters = ["alpha", "beta", "alpha", None, "beta"]
    greedy = [SamplingParams(0.0, 1.0, 8)] * len(adapters)
    sizes, handle = _prefill_batch_sizes(peft_model)
    try:
        fanned = TransformersBackend(peft_model, tok).generate([prompt] * 5, greedy, adapters=adapters)
        assert sizes == [3]  # one prefill per (prompt, adapter)
        plain = TransformersBackend(peft_model, tok, share_prefill=False).generate(
            [prompt] * 5, greedy, adapters=adapters
        )
    finally:
        handle.remove()
    assert [g.response_ids for g in fanned] == [g.response_ids for g in plain]
    assert fanned[0].logprobs == pytest.approx(fanned[2].logprobs, abs=1e-6)
    assert fanned[0].logprobs != pytest.approx(fanned[1].logprobs, abs=1e-3)


@pytest.mark.numerics
def test_per_row_seeds_make_sampling_batch_invariant(tmp_path):
    """A row's tokens depend on its own seed, not on its batch: alone, in a batch of 8, reversed, in chunks of 3.

    A random tiny model (near-uniform next-token distributions) so that every sampled row runs to its
    limit and rows differ; mixed temperatures, top-p and a greedy row in one batch.
    """
    from drmas_train.testing.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "llama", arch="llama", hidden_size=64, num_heads=2)
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    prompts = [_prompts(tok)[i % 3] for i in range(8)]
    settings = [SamplingParams(1.0, 1.0, 24), SamplingParams(0.7, 0.9, 24), SamplingParams(0.0, 1.0, 16)]
    sampling = [settings[i % 3] if i != 7 else SamplingParams(1.2, 0.95, 20) for i in range(8)]
    seeds = [1000 + 37 * i for i in range(8)]
    backend = TransformersBackend(model, tok)
    batch = backend.generate(prompts, sampling, seed=seeds)
    alone = [backend.generate([p], [s], seed=[k])[0] for p, s, k in zip(prompts, sampling, seeds)]
    flipped = backend.generate(prompts[::-1], sampling[::-1], seed=seeds[::-1])[::-1]
    chunked = TransformersBackend(model, tok, max_batch_size=3, share_prefill=False).generate(
        prompts, sampling, seed=seeds
    )
    ids = [g.response_ids for g in batch]
    for other in (alone, flipped, chunked):
        assert [g.response_ids for g in other] == ids
        for g, o in zip(batch, other):
            torch.testing.assert_close(torch.tensor(o.logprobs), torch.tensor(g.logprobs), atol=1e-5, rtol=0)
    assert len({tuple(r) for r in ids}) >= 7  # sampled rows differ (rows 2 and 5 are greedy, different prompts)
    assert all(len(r) == s.max_new_tokens for r, s in zip(ids, sampling))
    # A base seed is one seed per row, seed + i; another seed changes every sampled row.
    assert [g.response_ids for g in backend.generate(prompts, sampling, seed=5)] == [
        g.response_ids for g in backend.generate(prompts, sampling, seed=[5 + i for i in range(8)])
    ]
    other = backend.generate(prompts, sampling, seed=[k + 1 for k in seeds])
    assert all((o.response_ids != r) == (s.temperature > 0) for o, r, s in zip(other, ids, sampling))
    with pytest.raises(ValueError, match="3 seeds for 8 prompts"):
        backend.generate(prompts, sampling, seed=[1, 2, 3])


def _nucleus_by_full_sort(logits, top_p):
    """The top-p rule over a whole sorted row: drop a token once the mass before it reaches top_p."""
    probs, order = logits.softmax(-1).sort(descending=True, dim=-1)
    drop = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, (probs.cumsum(-1) - probs) >= top_p[:, None])
    return ~drop


@pytest.mark.numerics
@pytest.mark.parametrize("scale", [1.0, 8.0])  # flat rows: nucleus past the probe (full sort); peaked: inside it
def test_top_p_filter_keeps_the_nucleus_of_a_full_sort_and_top_p_one_keeps_all(scale):
    from drmas_train.engines.nucleus import NUCLEUS_PROBE, filter_top_p

    logits = torch.randn(8, 49152, generator=torch.Generator().manual_seed(0)) * scale
    top_p = torch.tensor([0.95, 1.0, 0.5, 0.9] * 2)
    kept = filter_top_p(logits, top_p) > float("-inf")
    filtered = top_p < 1
    assert torch.equal(kept[filtered], _nucleus_by_full_sort(logits[filtered], top_p[filtered]))
    sizes = kept[filtered].sum(-1)
    assert (sizes > NUCLEUS_PROBE).any() if scale == 1.0 else (sizes < NUCLEUS_PROBE).all()
    # top_p = 1 filters nothing, also the tokens whose mass a float32 cumsum rounds away (at scale 8 the
    # cumsum reaches 1.0 before the last ~47k tokens, which a full-sort rule at top_p = 1 would drop)
    assert kept[~filtered].all()
