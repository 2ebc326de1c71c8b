"""Mixed precision in the learner (`learner.compute_dtype`): bf16 matmuls over fp32 master weights."""

import copy

import pytest
import torch
from batches import shared_prefix_records
from transformers import AutoModelForCausalLM

from drmas_train.learner import Learner, PPOConfig
from drmas_train.learner.precision import resolve_compute_dtype
from drmas_train.models.engine import native_bf16
from drmas_train.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def base_model(tmp_path_factory):
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", arch="llama", seed=0)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _output_dtypes(model, fn) -> dict[str, set[torch.dtype]]:
    """The dtypes a middle projection and the LM head output while `fn` runs."""
    seen: dict[str, set[torch.dtype]] = {"q_proj": set(), "lm_head": set()}
    modules = {"q_proj": model.model.layers[0].self_attn.q_proj, "lm_head": model.lm_head}
    hooks = [
        m.register_forward_hook(lambda _m, _i, out, name=name: seen[name].add(out.dtype)) for name, m in modules.items()
    ]
    try:
        fn()
    finally:
        for h in hooks:
            h.remove()
    return seen


def _flat_grad(model) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("forward", ["plain", "shared_prefix"])
def test_bf16_compute_runs_bf16_matmuls_and_keeps_fp32_weights_gradients_and_head(base_model, forward):
    records = shared_prefix_records(base_model.config.vocab_size)
    fp32, bf16 = copy.deepcopy(base_model), copy.deepcopy(base_model)
    Learner(fp32, PPOConfig(forward=forward)).compute_gradients(records)
    learner = Learner(bf16, PPOConfig(forward=forward, compute_dtype="bfloat16"))
    seen = _output_dtypes(bf16, lambda: learner.compute_gradients(records))
    assert seen == {"q_proj": {torch.bfloat16}, "lm_head": {torch.float32}}
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in bf16.parameters())
    g32, g16 = _flat_grad(fp32), _flat_grad(bf16)
    assert not torch.equal(g32, g16)  # bf16 matmuls ran
    assert float(torch.nn.functional.cosine_similarity(g32, g16, dim=0)) > 0.99
    # log-probs stay close to fp32's (the head and log-softmax are fp32; only the body rounds)
    for a, b in zip(Learner(fp32, PPOConfig()).logprobs(records), learner.logprobs(records)):
        torch.testing.assert_close(b, a, atol=0.1, rtol=0.0)


def test_bf16_update_steps_fp32_master_weights_and_optimizer_state(base_model):
    model = copy.deepcopy(base_model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    learner = Learner(model, PPOConfig(compute_dtype="bfloat16", lr=1e-3))
    out = learner.update(shared_prefix_records(model.config.vocab_size))
    assert out["skipped"] == 0 and out["grad_norm"] > 0
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert moved and all(p.dtype == torch.float32 for p in model.parameters())
    states = [s for s in learner.optimizer.state.values()]
    assert states and all(s["exp_avg"].dtype == torch.float32 for s in states)


def test_float32_compute_is_plain_fp32(base_model):
    model = copy.deepcopy(base_model)
    learner = Learner(model, PPOConfig())
    seen = _output_dtypes(model, lambda: learner.compute_gradients(shared_prefix_records(model.config.vocab_size)))
    assert seen == {"q_proj": {torch.float32}, "lm_head": {torch.float32}}


def test_resolve_compute_dtype():
    assert resolve_compute_dtype("float32", device_type="cpu", weights=torch.float32) is None
    assert resolve_compute_dtype("bfloat16", device_type="cpu", weights=torch.float32) is torch.bfloat16
    # bf16 weights (models.dtype bfloat16) compute in bf16 already: no autocast, no fp32 master
    assert resolve_compute_dtype("bfloat16", device_type="cpu", weights=torch.bfloat16) is None
    native, _ = native_bf16("cpu")
    assert resolve_compute_dtype("auto", device_type="cpu", weights=torch.float32) is (
        torch.bfloat16 if native else None
    )
    with pytest.raises(ValueError, match="compute_dtype"):
        resolve_compute_dtype("float16", device_type="cpu", weights=torch.float32)


def test_compute_dtype_is_a_checked_config_field():
    with pytest.raises(ValueError, match="learner.compute_dtype must be one of"):
        PPOConfig(compute_dtype="half")
