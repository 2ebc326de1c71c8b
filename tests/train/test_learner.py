"""The PPO learner on a real tiny random Llama: log-probs, token-mean exactness, skipping, dual clip."""

import copy
import dataclasses
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from drmas_train.algorithm.records import CallRecord
from drmas_train.learner import Learner, PPOConfig, lora_param_groups
from drmas_train.learner.forward import score
from drmas_train.learner.loss import kl_k3, make_batch, ppo_token_losses
from drmas_train.testing.tiny import build_tiny_model


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_torch_thread):
    """torch on one thread for this module (tests/conftest.py)."""


@pytest.fixture(scope="module")
def base_model(tmp_path_factory):
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", arch="llama", seed=0)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@pytest.fixture
def model(base_model):
    return copy.deepcopy(base_model)


def rec(prompt, response, adv, *, episode=0, agent="solver", adapter=None, logprobs=None):
    return CallRecord(
        group_id=0,
        episode_id=episode,
        agent=agent,
        model="m",
        turn=0,
        prompt_ids=list(prompt),
        response_ids=list(response),
        logprobs=list(logprobs) if logprobs is not None else [0.0] * len(response),
        advantage=adv,
        adapter=adapter,
    )


def random_records(n, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p_len, r_len = torch.randint(1, 12, (2,), generator=g).tolist()
        prompt = torch.randint(5, vocab, (p_len,), generator=g).tolist()
        response = torch.randint(5, vocab, (r_len,), generator=g).tolist()
        out.append(rec(prompt, response, float(torch.randn(1, generator=g)), episode=i))
    return out


def direct_logprobs(model, prompt, response):
    """log p(response | prompt) from a forward on the unpadded sequence."""
    logits = model(torch.tensor([list(prompt) + list(response)])).logits[0].float()
    logp = logits.log_softmax(-1)
    return torch.stack([logp[len(prompt) - 1 + t, tok] for t, tok in enumerate(response)])


def snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_logprobs_match_direct_forward_on_unpadded_sequences(model):
    records = random_records(6, model.config.vocab_size, seed=1)
    batch = make_batch([r.prompt_ids for r in records], [r.response_ids for r in records], pad_token_id=0)
    with torch.no_grad():
        logp = score(model, records, forward="plain").logp
        for i, r in enumerate(records):
            n = len(r.response_ids)
            torch.testing.assert_close(
                logp[i, :n], direct_logprobs(model, r.prompt_ids, r.response_ids), atol=1e-5, rtol=0
            )
            assert batch.response_mask[i].sum() == n and not batch.response_mask[i, n:].any()


def test_gradient_is_exact_token_mean_for_any_micro_batch_size(model):
    # Reference: sum over all tokens of -A_i * grad log p / (total tokens), each sequence unpadded.
    records = random_records(7, model.config.vocab_size, seed=2)
    n_tokens = sum(len(r.response_ids) for r in records)
    ref_model = copy.deepcopy(model)
    loss = sum(-(r.advantage * direct_logprobs(ref_model, r.prompt_ids, r.response_ids)).sum() for r in records)
    (loss / n_tokens).backward()
    ref = {n: p.grad.clone() for n, p in ref_model.named_parameters()}
    for micro, checkpointing in ((1, False), (3, False), (7, False), (3, True)):
        m = copy.deepcopy(model)
        cfg = PPOConfig(micro_batch_size=micro, gradient_checkpointing=checkpointing)
        metrics = Learner(m, cfg).compute_gradients(records)
        assert metrics["n_tokens"] == n_tokens
        for n, p in m.named_parameters():
            torch.testing.assert_close(p.grad, ref[n], atol=2e-6, rtol=1e-4, msg=f"micro={micro} {n}")
    ref_norm = torch.nn.utils.get_total_norm(list(ref.values())).item()
    out = Learner(copy.deepcopy(model), PPOConfig(micro_batch_size=2)).update(records)
    assert out["grad_norm"] == pytest.approx(ref_norm, rel=1e-4)  # the PRE-clip norm


def test_step_changes_weights_and_makes_the_rewarded_response_more_likely(model):
    prompt, good, bad = [10, 11, 12, 13], [20, 21, 22], [30, 31, 32]
    records = [rec(prompt, good, 1.0, episode=0), rec(prompt, bad, -1.0, episode=1)]
    with torch.no_grad():
        before = {k: direct_logprobs(model, prompt, r).sum().item() for k, r in (("good", good), ("bad", bad))}
    w0 = snapshot(model)
    learner = Learner(model, PPOConfig(lr=1e-3, grad_clip=1.0))
    for _ in range(5):
        metrics = learner.update(records)
        assert metrics["skipped"] == 0 and math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    assert metrics["n_tokens"] == 6 and metrics["n_opt_steps"] == 1 and metrics["ratio_mean"] == pytest.approx(1.0)
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, w0[n])]
    assert len(changed) == len(w0)
    with torch.no_grad():
        after = {k: direct_logprobs(model, prompt, r).sum().item() for k, r in (("good", good), ("bad", bad))}
    assert after["good"] > before["good"] + 0.1
    assert after["bad"] < before["bad"] - 0.1


def test_skip_zero_advantage_trains_only_nonzero_calls_to_the_same_update(model):
    records = random_records(8, model.config.vocab_size, seed=7)
    for r in records[::2]:
        r.advantage = 0.0  # half the calls: a group whose rewards were all equal
    scored: list[int] = []  # tokens the skipping learner's model scores
    full, skip = copy.deepcopy(model), copy.deepcopy(model)
    counted = skip.register_forward_hook(lambda mod, args, out: scored.append(out.logits.shape[1]))
    cfg = {"lr": 1e-3, "micro_batch_size": 2, "forward": "plain"}
    a = Learner(full, PPOConfig(**cfg)).update(records)
    b = Learner(skip, PPOConfig(**cfg, skip_zero_advantage=True)).update(records)
    trained = sum(len(r.response_ids) for r in records[1::2])
    assert sum(scored) == trained == b["n_tokens"] and b["zero_adv_skipped"] == 4 and a["zero_adv_skipped"] == 0
    assert b["n_opt_steps"] == 1 and b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    for (n, p), q in zip(full.named_parameters(), skip.parameters()):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=1e-5, msg=n)
    # Every call at 0: no pass and no optimizer step (AdamW's momentum would otherwise move the weights).
    w = snapshot(skip)
    learner = Learner(skip, PPOConfig(**cfg, skip_zero_advantage=True))
    zeros = learner.update([dataclasses.replace(r, advantage=0.0) for r in records])
    assert zeros["grad_norm"] == 0 and zeros["zero_adv_skipped"] == 8 and sum(scored) == trained
    assert all(torch.equal(p, w[n]) for n, p in skip.named_parameters())
    # With an entropy term a zero-advantage call has a gradient: nothing is skipped.
    counted.remove()
    kept = Learner(copy.deepcopy(model), PPOConfig(**cfg, skip_zero_advantage=True, entropy_coef=0.01))
    assert kept.update(records)["zero_adv_skipped"] == 0


def test_non_finite_gradient_skips_the_step_and_keeps_weights(model):
    records = random_records(4, model.config.vocab_size, seed=3)
    learner = Learner(model, PPOConfig(lr=1e-3))
    w0 = snapshot(model)
    nan_records = [copy.copy(r) for r in records]
    nan_records[1].advantage = float("nan")  # a NaN loss
    out = learner.update(nan_records)
    assert out["skipped"] == 1 and not math.isfinite(out["grad_norm"])
    assert all(torch.equal(p, w0[n]) for n, p in model.named_parameters())
    assert all(p.grad is None for p in model.parameters()) and not learner.optimizer.state
    # A NaN injected straight into one parameter's gradient.
    p0 = next(model.parameters())
    handle = p0.register_hook(lambda g: g * float("nan"))
    assert learner.update(records)["skipped"] == 1
    assert all(torch.equal(p, w0[n]) for n, p in model.named_parameters())
    handle.remove()
    empty = learner.update([rec([1, 2], [], 1.0)])  # no response tokens: nothing to learn from, no step
    assert empty["n_tokens"] == 0 and empty["n_opt_steps"] == 0 and empty["skipped"] == 0
    assert all(torch.equal(p, w0[n]) for n, p in model.named_parameters())
    out = learner.update(records)
    assert out["skipped"] == 0 and any(not torch.equal(p, w0[n]) for n, p in model.named_parameters())


def test_dual_clip_loss_on_hand_numbers():
    # A, ratio -> per-token loss (clip 0.8..1.2, dual clip c = 3 on A < 0):
    #  +1, 1.5 -> max(-1.5, -1.2) = -1.2 (clipped)   +1, 0.5 -> max(-0.5, -0.8) = -0.5
    #  -1, 0.5 -> max( 0.5,  0.8) =  0.8 (clipped)   -1, 2.0 -> max(2, 1.2) = 2, below the cap 3
    #  -1, 5.0 -> max( 5.0,  1.2) = 5 -> cap 3        -2, 4.0 -> 8 -> cap 6       +1, 5.0 -> -1.2
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, -1.0, -2.0, 1.0])
    ratio = torch.tensor([1.5, 0.5, 0.5, 2.0, 5.0, 4.0, 5.0])
    logp = torch.log(ratio).requires_grad_(True)
    loss, info = ppo_token_losses(
        logp.unsqueeze(-1), torch.zeros(7, 1), adv, clip_low=0.2, clip_high=0.2, dual_clip=3.0
    )
    torch.testing.assert_close(loss.squeeze(-1), torch.tensor([-1.2, -0.5, 0.8, 2.0, 3.0, 6.0, -1.2]))
    assert info["clipped"].squeeze(-1).tolist() == [True, False, True, False, False, False, True]
    assert info["dual_clipped"].squeeze(-1).tolist() == [False, False, False, False, True, True, False]
    loss.sum().backward()
    # d(-A * ratio)/d logp = -A * ratio where unclipped; 0 where any clip is active.
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, -0.5, 0.0, 2.0, 0.0, 0.0, 0.0]))
    for bad in ({"dual_clip": 1.0}, {"clip_low": 1.0}, {"old_logprobs": "vllm"}, {"micro_batch_size": 0}):
        with pytest.raises(ValueError):
            PPOConfig(**bad)
    no_dual, _ = ppo_token_losses(torch.log(ratio).unsqueeze(-1), torch.zeros(7, 1), adv, dual_clip=None)
    assert no_dual[4].item() == pytest.approx(5.0) and no_dual[5].item() == pytest.approx(8.0)


def test_kl_k3_and_kl_entropy_terms_in_the_learner(model):
    # k3 with ref - logp = log 2: 2 - log 2 - 1 = 0.306853; equal log-probs: 0.
    torch.testing.assert_close(
        kl_k3(torch.tensor([0.0, -1.0]), torch.tensor([math.log(2), -1.0])), torch.tensor([1 - math.log(2), 0.0])
    )
    records = random_records(4, model.config.vocab_size, seed=4)
    learner = Learner(model, PPOConfig(lr=1e-3, kl_coef=0.5, entropy_coef=0.01))
    assert learner.ref_model is not None and not any(p.requires_grad for p in learner.ref_model.parameters())
    first = learner.update(records)
    assert first["kl"] == pytest.approx(0.0, abs=1e-7)  # the policy still equals the reference
    assert first["loss"] == pytest.approx(first["pg_loss"] - 0.01 * first["entropy"], abs=1e-6)
    second = learner.update(records)
    assert second["kl"] > 1e-8
    assert second["loss"] == pytest.approx(second["pg_loss"] + 0.5 * second["kl"] - 0.01 * second["entropy"], abs=1e-6)
    assert Learner(copy.deepcopy(model), PPOConfig()).ref_model is None  # kl off: no reference held


def test_sampled_old_logprobs_and_several_optimizer_steps(model):
    records = random_records(6, model.config.vocab_size, seed=5)
    with torch.no_grad():
        for r in records:
            r.logprobs = direct_logprobs(model, r.prompt_ids, r.response_ids).tolist()
    sampled = Learner(copy.deepcopy(model), PPOConfig(lr=1e-3, old_logprobs="sampled")).update(records)
    assert sampled["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    multi = Learner(model, PPOConfig(lr=1e-2, ppo_epochs=2, mini_batches=2, micro_batch_size=2)).update(records)
    assert multi["n_opt_steps"] == 4 and multi["skipped"] == 0
    assert multi["ratio_max"] > 1.0 + 1e-4  # later steps see a moved policy against the recomputed old one
    bad = [copy.copy(records[0])]
    bad[0].logprobs = [0.0]
    if len(bad[0].response_ids) != 1:
        with pytest.raises(ValueError, match="log-probs for"):
            Learner(copy.deepcopy(model), PPOConfig(old_logprobs="sampled")).update(bad)


def test_sampler_kl_measures_how_far_the_engine_is_from_the_learner(model):
    records = random_records(6, model.config.vocab_size, seed=6)
    with torch.no_grad():
        for r in records:
            r.logprobs = direct_logprobs(model, r.prompt_ids, r.response_ids).tolist()
    same = Learner(copy.deepcopy(model), PPOConfig(lr=1e-3)).update(records)
    assert same["sampler_kl"] == pytest.approx(0.0, abs=1e-6)  # an engine computing the learner's distribution
    delta = 0.3  # an engine that gives every sampled token 0.3 nats more than the learner does
    for r in records:
        r.logprobs = [x + delta for x in r.logprobs]
    shifted = Learner(copy.deepcopy(model), PPOConfig(lr=1e-3, micro_batch_size=2)).update(records)
    # k3 with learner - engine = -0.3 on every token: exp(-0.3) + 0.3 - 1 = 0.040818
    assert shifted["sampler_kl"] == pytest.approx(math.exp(-delta) + delta - 1, rel=1e-4)
    assert "sampler_kl" not in Learner(copy.deepcopy(model), PPOConfig(old_logprobs="sampled")).update(records)


def test_per_agent_lora_adapters_get_their_own_lr_and_grad_norms(model):
    peft = pytest.importorskip("peft")
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    pm = peft.get_peft_model(model, lora, adapter_name="solver")
    pm.add_adapter("verifier", lora)
    groups = lora_param_groups(pm, default_lr=1e-3, lr_by_adapter={"verifier": 0.0})
    assert [g["name"] for g in groups] == ["solver", "verifier"] and groups[1]["lr"] == 0.0
    learner = Learner(pm, PPOConfig(), param_groups=groups)
    # LoRA B starts at zero, so the first step moves only B; do two steps so A moves too.
    records = [
        rec([10, 11], [20, 21], 1.0, adapter="solver"),
        rec([10, 11], [30, 31], -1.0, episode=1, adapter="verifier"),
    ]
    w0 = snapshot(pm)
    for _ in range(2):
        out = learner.update(records)
    assert out["grad_norm/solver"] > 0 and out["grad_norm/verifier"] > 0
    moved = {n for n, p in pm.named_parameters() if not torch.equal(p, w0[n])}
    assert moved and all(".solver." in n for n in moved)  # lr 0 for the verifier; the base is frozen
    # KL on a peft model: the reference is the base with adapters disabled, no copy is held.
    kl_learner = Learner(pm, PPOConfig(kl_coef=0.1), param_groups=lora_param_groups(pm, default_lr=1e-3))
    assert kl_learner.ref_model is None
    assert kl_learner.update(records[:1])["kl"] > 1e-8  # the solver adapter has moved away from the base


def test_lm_head_chunks_recomputed_in_backward_give_the_same_gradients(model):
    """A chunk of a few positions (so backward recomputes every chunk's logits) changes nothing."""
    records = random_records(6, model.config.vocab_size, seed=6)
    for r in records:
        r.temperature = 0.7
    whole, chunked = copy.deepcopy(model), copy.deepcopy(model)
    ppo = dict(micro_batch_size=3, entropy_coef=0.01)
    a = Learner(whole, PPOConfig(**ppo)).compute_gradients(records)
    learner = Learner(chunked, PPOConfig(logits_chunk_mib=4 * 4 * model.config.vocab_size / 2**20, **ppo))
    assert learner.chunk_tokens == 4
    b = learner.compute_gradients(records)
    assert a["entropy"] == pytest.approx(b["entropy"], rel=1e-6) and a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    for (n, p), q in zip(whole.named_parameters(), chunked.parameters()):
        torch.testing.assert_close(q.grad, p.grad, atol=1e-7, rtol=1e-5, msg=n)


def _grads(model, records, **knobs):
    learner = Learner(model, PPOConfig(forward="plain", **knobs))
    learner.compute_gradients(records)
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("loss_agg", ["token_mean", "micro_token_mean"])
def test_loss_agg_weighs_tokens_or_micro_batches(base_model, loss_agg):
    records = [rec([5, 6, 7], [8, 9], 1.0, episode=0), rec([5, 6], [9, 10, 11, 12, 13, 14], -0.5, episode=1)]
    # Each record alone (one micro-batch of one record): its own token-mean gradient g_i, n_i tokens.
    alone = [_grads(copy.deepcopy(base_model), [r]) for r in records]
    n = torch.tensor([float(len(r.response_ids)) for r in records])
    one_per_micro = _grads(copy.deepcopy(base_model), records, micro_batch_size=1, loss_agg=loss_agg)
    if loss_agg == "token_mean":  # every token the same weight: sum_i n_i g_i / sum_i n_i
        expected = (n[0] * alone[0] + n[1] * alone[1]) / n.sum()
    else:  # verl: the micro-batches' token-means, averaged: (g_0 + g_1) / 2
        expected = (alone[0] + alone[1]) / 2
    torch.testing.assert_close(one_per_micro, expected, rtol=1e-4, atol=1e-7)
    # One micro-batch holding both: the two modes agree (a token-mean of the one micro-batch).
    together = _grads(copy.deepcopy(base_model), records, micro_batch_size=2, loss_agg=loss_agg)
    torch.testing.assert_close(together, (n[0] * alone[0] + n[1] * alone[1]) / n.sum(), rtol=1e-4, atol=1e-7)


def test_loss_denominator_by_hand():
    from drmas_train.learner.ppo import loss_denominator

    assert loss_denominator("token_mean", 3, 10, 4) == 10.0
    assert loss_denominator("micro_token_mean", 3, 10, 4) == 12.0


def test_optimizer_offload_moves_the_state_out_and_in_once_per_update_and_changes_no_number(model):
    records = random_records(6, model.config.vocab_size, seed=7)
    config = {"lr": 1e-2, "mini_batches": 2, "micro_batch_size": 2}
    on_device = Learner(copy.deepcopy(model), PPOConfig(**config))
    offloaded = Learner(copy.deepcopy(model), PPOConfig(**config, optimizer_offload=True))
    n_state = 2 * len(offloaded.params)  # AdamW's exp_avg and exp_avg_sq per parameter
    for update in range(3):
        kept = {id(v) for s in offloaded.optimizer.state.values() for v in s.values() if torch.is_tensor(v)}
        assert on_device.update(records) == offloaded.update(records)
        # exactly one move in and one out per update; the first update's "in" finds no state yet
        assert offloaded.optimizer_moves[2 * update :] == [("in", n_state if update else 0), ("out", n_state)]
        held = [v for s in offloaded.optimizer.state.values() for k, v in s.items() if k != "step"]
        assert {v.device.type for v in held} == {"cpu"} and not kept & {id(v) for v in held}  # new copies
    for a, b in zip(on_device.params, offloaded.params):
        assert torch.equal(a, b)
    for a, b in zip(on_device.optimizer.state.values(), offloaded.optimizer.state.values()):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert on_device.optimizer_moves == []
