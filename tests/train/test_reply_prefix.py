"""A reply prefix (`PromptTemplate.reply_prefix`) reaches the model as the start of its reply.

The rollout appends the prefix's tokens after the chat template's generation prompt (never cut by the
prompt cap), the model continues it, and the env parses prefix + continuation: what the learner
trains on (the continuation's ids after a prompt that ends with the prefix) is what was sampled.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import drmas_envs
from drmas_train.engines.assignment import Policy
from drmas_train.engines.base import SamplingParams
from drmas_train.engines.transformers_backend import TransformersBackend
from drmas_train.rollout import chat_prompt, rollout
from drmas_train.testing.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("prefix") / "llama", arch="llama", hidden_size=64, num_heads=2)
    return path, AutoTokenizer.from_pretrained(path)


def test_chat_prompt_ends_with_the_prefix_even_when_cut(tiny):
    _, tok = tiny
    obs = {"system": "You check answers. " * 40, "user": "Is 2 + 2 = 4?", "reply_prefix": "<verify>"}
    plain = chat_prompt(tok, {**obs, "reply_prefix": ""}, 4096)
    tail = tok.encode("<verify>", add_special_tokens=False)
    assert chat_prompt(tok, obs, 4096) == plain + tail
    cut = chat_prompt(tok, obs, 64)
    head = (64 - len(tail)) // 2  # the cap keeps the prompt's head and tail, then the prefix
    assert len(cut) == 64 and cut[-len(tail) :] == tail and cut[:head] == plain[:head]


def test_rollout_samples_after_the_prefix_and_the_env_parses_the_whole_reply(tiny):
    path, tok = tiny
    model = AutoModelForCausalLM.from_pretrained(path)
    policy = Policy("shared", model, tok, TransformersBackend(model, tok), ["solver", "verifier"])
    envs = [drmas_envs.make("math-2agent", verdict_first=True) for _ in range(4)]
    sampling = {a: SamplingParams(1.0, 1.0, 6) for a in ("solver", "verifier")}
    batch = rollout(envs, [0, 1], 2, {"solver": policy, "verifier": policy}, sampling, seed=3)
    tail = tok.encode("<verify>", add_special_tokens=False)
    verifier = [r for r in batch.records if r.agent == "verifier"]
    assert len(verifier) == 4
    for r in verifier:
        assert r.prompt_ids[-len(tail) :] == tail and r.extra["reply_prefix"] == "<verify>"
        reply = envs[r.episode_id].unwrapped.workflow.history[r.turn].text
        assert reply == "<verify>" + r.text  # the env parsed prefix + continuation
    with torch.no_grad():  # the sampled log-probs belong to the continuation of the prefixed prompt
        r = verifier[0]
        ids = torch.tensor([r.prompt_ids + r.response_ids])
        logits = model(ids).logits[0, len(r.prompt_ids) - 1 : -1].log_softmax(-1)
        again = logits.gather(-1, torch.tensor(r.response_ids)[:, None]).squeeze(-1)
    assert torch.allclose(again, torch.tensor(r.logprobs), atol=1e-4)
    solver = [r for r in batch.records if r.agent == "solver"]
    assert all(r.extra["reply_prefix"] == "" for r in solver)
