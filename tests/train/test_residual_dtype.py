"""`learner.residual_dtype`: the hidden states between decoder layers in the compute dtype (bf16) under
mixed precision, as verl keeps them; what gradient checkpointing saves per layer halves."""

import copy

import pytest
import torch
from batches import flat_grad, shared_prefix_records
from transformers import AutoModelForCausalLM

from drmas_train.learner import Learner, PPOConfig
from drmas_train.learner.distributed import decoder_layers
from drmas_train.testing.tiny import build_tiny_model


@pytest.fixture(scope="module")
def base_model(tmp_path_factory):
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny") / "qwen", arch="qwen2", seed=0)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _layer_inputs(model, fn) -> set[torch.dtype]:
    """The dtypes of the hidden states each decoder layer receives (seen before any of the learner's hooks)."""
    seen: set[torch.dtype] = set()

    def record(_m, args, kwargs):
        x = args[0] if args else kwargs["hidden_states"]
        seen.add(x.dtype)

    hooks = [layer.register_forward_pre_hook(record, with_kwargs=True, prepend=True) for layer in decoder_layers(model)]
    try:
        fn()
    finally:
        for h in hooks:
            h.remove()
    return seen


@pytest.mark.parametrize("checkpointing", [False, True])
def test_compute_residual_carries_bf16_between_layers_with_gradients_close_to_fp32s(base_model, checkpointing):
    records = shared_prefix_records(base_model.config.vocab_size)
    common = dict(compute_dtype="bfloat16", forward="plain", gradient_checkpointing=checkpointing)
    fp32_res, bf16_res = copy.deepcopy(base_model), copy.deepcopy(base_model)
    kept = Learner(fp32_res, PPOConfig(**common))
    carried = Learner(bf16_res, PPOConfig(**common, residual_dtype="compute"))
    assert _layer_inputs(fp32_res, lambda: kept.compute_gradients(records)) == {torch.float32}
    assert _layer_inputs(bf16_res, lambda: carried.compute_gradients(records)) == {torch.bfloat16}
    g32, g16 = flat_grad(fp32_res), flat_grad(bf16_res)
    assert all(p.grad.dtype == torch.float32 and p.dtype == torch.float32 for p in bf16_res.parameters())
    assert not torch.equal(g32, g16)  # the residual additions rounded to bf16
    # Both runs round their matmuls to bf16 (8 significant bits); carrying the residual in bf16 adds one more
    # rounding per addition, so the gradients agree in direction as closely as bf16 compute agrees with fp32.
    assert float(torch.nn.functional.cosine_similarity(g32, g16, dim=0)) > 0.99
    assert float((g16 - g32).norm() / g32.norm()) < 0.1


def test_outside_autocast_nothing_is_cast(base_model):
    """The transformers engine generates with the learner's own model, without autocast: untouched."""
    model = copy.deepcopy(base_model)
    Learner(model, PPOConfig(compute_dtype="bfloat16", residual_dtype="compute"))
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        seen = _layer_inputs(model, lambda: model(ids))
        assert seen == {torch.float32}
        torch.testing.assert_close(model(ids).logits, base_model(ids).logits, rtol=0, atol=0)


def test_residual_dtype_is_moot_under_fp32_compute(base_model):
    a, b = copy.deepcopy(base_model), copy.deepcopy(base_model)
    records = shared_prefix_records(base_model.config.vocab_size)
    Learner(a, PPOConfig(forward="plain")).compute_gradients(records)
    learner = Learner(b, PPOConfig(forward="plain", residual_dtype="compute"))
    assert _layer_inputs(b, lambda: learner.compute_gradients(records)) == {torch.float32}
    assert torch.equal(flat_grad(a), flat_grad(b))


def test_residual_dtype_is_a_checked_choice():
    with pytest.raises(ValueError, match="residual_dtype"):
        PPOConfig(residual_dtype="half")
