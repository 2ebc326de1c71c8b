"""A temperature-faithful learner: each call is scored at its own sampling temperature.

The PPO ratio exp(learner log-prob - engine sampling log-prob) must be 1 on-policy at T = 0.7 and
with agents sampling at different temperatures (0.7 and 1.0) on one model, within 1e-4 mean and
1e-3 max absolute per token. Here: the transformers backend and a rollout through the trainer;
the vLLM backend's half is in test_vllm_backend.py.
"""

import copy

import pytest
import torch
from nucleus_oracle import LOGP_ATOL, log_ratio_bounds
from transformers import AutoModelForCausalLM, AutoTokenizer

from drmas_train.algorithm.records import CallRecord
from drmas_train.engines.base import SamplingParams
from drmas_train.engines.resolve import resolve_model
from drmas_train.engines.transformers_backend import TransformersBackend
from drmas_train.learner import Learner, PPOConfig

MEAN_TOL, MAX_TOL = 1e-4, 1e-3
TOP_P = 0.9


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    path = resolve_model("tiny-math")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def _prompts(tok):
    chats = [
        [{"role": "system", "content": "You are the Solver."}, {"role": "user", "content": "What is 3 + 4?"}],
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "You are the Verifier."}, {"role": "user", "content": "Check 2 + 2 = 5."}],
    ]
    return [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False) for c in chats]


def records_from(gens, agents, temperatures):
    """Call records as the rollout builds them: exact ids, sampling log-probs, the call's temperature."""
    return [
        CallRecord(
            group_id=0,
            episode_id=i,
            agent=a,
            model="m",
            turn=0,
            prompt_ids=g.prompt_ids,
            response_ids=g.response_ids,
            logprobs=g.logprobs,
            temperature=t,
        )
        for i, (g, a, t) in enumerate(zip(gens, agents, temperatures))
    ]


def ratio_errors(learner: Learner, records) -> tuple[float, float]:
    """Mean and max |exp(learner - engine) - 1| over every response token."""
    learned = learner.logprobs(records)
    diffs = torch.cat([lp - torch.tensor(r.logprobs) for lp, r in zip(learned, records)])
    err = (diffs.exp() - 1).abs()
    return float(err.mean()), float(err.max())


def tempered_rows(model, prompt, response, temperature):
    """log softmax(logits / T) over the vocabulary at every response position, by one forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1)


def direct_tempered(model, prompt, response, temperature):
    return tempered_rows(model, prompt, response, temperature).gather(1, torch.tensor(response)[:, None])[:, 0]


@pytest.mark.numerics
def test_learner_scores_each_call_at_its_own_temperature(tiny):
    model, tok = tiny
    prompts = _prompts(tok)
    responses = [[40, 41, 42, 43], [50, 51], [60, 61, 62]]
    temps = [0.7, 1.0, 0.0]  # greedy calls are scored at 1, as engines report them
    records = [
        CallRecord(0, i, "a", "m", 0, p, r, [0.0] * len(r), temperature=t)
        for i, (p, r, t) in enumerate(zip(prompts, responses, temps))
    ]
    learner = Learner(copy.deepcopy(model), PPOConfig(micro_batch_size=3))  # one mixed micro-batch
    for record, got in zip(records, learner.logprobs(records)):
        want = direct_tempered(model, record.prompt_ids, record.response_ids, record.score_temperature)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    cold = direct_tempered(model, prompts[0], responses[0], 1.0)
    assert (learner.logprobs(records[:1])[0] - cold).abs().max() > 1e-2  # so the check can tell T apart


@pytest.mark.parametrize("temps", [(0.7, 0.7), (0.7, 1.0)], ids=["T0.7", "mixed0.7-1.0"])
def test_ppo_ratio_is_one_against_the_transformers_backend(tiny, temps):
    model, tok = tiny
    backend = TransformersBackend(model, tok)
    agents = ["solver", "verifier"] * 6
    prompts = _prompts(tok) * 4
    by_agent = dict(zip(["solver", "verifier"], temps))
    sampling = [SamplingParams(temperature=by_agent[a], top_p=1.0, max_new_tokens=16) for a in agents]
    gens = backend.generate(prompts, sampling, seed=5)
    records = records_from(gens, agents, [s.temperature for s in sampling])
    assert sum(len(r.response_ids) for r in records) > 30
    learner = Learner(copy.deepcopy(model), PPOConfig(micro_batch_size=4))
    mean, worst = ratio_errors(learner, records)
    assert mean < MEAN_TOL and worst < MAX_TOL, (mean, worst)
    metrics = Learner(copy.deepcopy(model), PPOConfig(old_logprobs="sampled")).compute_gradients(records)
    assert abs(metrics["ratio_mean"] - 1) < MEAN_TOL


def test_top_p_logprobs_are_renormalised_over_the_nucleus(tiny):
    """At top-p 0.9 the backend reports log softmax(logits / T) renormalised over the nucleus, as vLLM does.

    So the ratio "sampled" and "decoupled" take, exp(learner - behaviour), is the nucleus's mass at each
    token's context (nucleus_oracle), at T 0.7 and 1; a greedy row ignores top-p and stays at ratio 1.
    The vLLM engine's half, and the two backends side by side: test_vllm_backend.py.
    """
    model, tok = tiny
    backend = TransformersBackend(model, tok)
    settings = [SamplingParams(t, TOP_P, 16) for t in (0.7, 1.0, 0.0)] * 3
    prompts = [p for p in _prompts(tok) for _ in range(3)]
    gens = backend.generate(prompts, settings, seed=2)
    records = records_from(gens, ["a"] * len(gens), [s.temperature for s in settings])
    learner = Learner(copy.deepcopy(model), PPOConfig())
    cut = 0
    for g, s, learned in zip(gens, settings, learner.logprobs(records)):
        log_ratio = learned - torch.tensor(g.logprobs)
        if s.temperature == 0:
            assert float(log_ratio.abs().max()) <= LOGP_ATOL
            continue
        rows = tempered_rows(model, g.prompt_ids, g.response_ids, s.temperature)
        low, high = log_ratio_bounds(rows, TOP_P, LOGP_ATOL)
        assert bool(((low <= log_ratio) & (log_ratio <= high)).all()), (s.temperature, log_ratio, low, high)
        cut += int((high < 0).sum())
    assert cut > 20  # tokens where an un-renormalised log-prob (ratio 1) is outside the bounds


def test_rollout_records_each_agents_temperature(tmp_path):
    """Through the trainer's own rollout: per-agent temperatures reach the records and the ratio is 1."""
    from drmas_train.config import build_config
    from drmas_train.rollout import rollout
    from drmas_train.run.trainer import Trainer

    over = {"log.run_dir": str(tmp_path / "run"), "agents.solver.temperature": 0.7, "rollout.temperature": 1.0}
    trainer = Trainer(build_config("smoke", over))
    try:
        batch = rollout(trainer.envs, [0, 1], 4, trainer.serving, trainer.sampling, seed=3, max_prompt_tokens=512)
        assert {r.agent: r.temperature for r in batch.records} == {"solver": 0.7, "verifier": 1.0}
        mean, worst = ratio_errors(trainer.learners["shared"], batch.records)
        assert mean < MEAN_TOL and worst < MAX_TOL, (mean, worst)
    finally:
        trainer.close()
