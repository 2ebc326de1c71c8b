"""Mixed precision in the learner (`learner.compute_dtype`): bf16 matmuls over fp32 master weights."""

import contextlib
import copy

import pytest
import torch
from batches import flat_grad, shared_prefix_records
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

from drmas_train.engines.settings import native_bf16
from drmas_train.learner import Learner, PPOConfig, ppo
from drmas_train.learner.forward import head_scores
from drmas_train.learner.precision import resolve_compute_dtype
from drmas_train.testing.tiny import build_tiny_model

pytestmark = pytest.mark.numerics  # bf16 and fp32 results compared: they depend on the CPU's kernels


@pytest.fixture(scope="module")
def base_model(tmp_path_factory):
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", arch="llama", seed=0)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _output_dtypes(model, fn) -> dict[str, set[torch.dtype]]:
    """The dtypes a middle projection outputs while `fn` runs. (Not the LM head: inside the learner its
    forward returns the fp32 scores, whatever its matmul ran in; `head_scores` is tested on its own below.)"""
    seen: dict[str, set[torch.dtype]] = {"q_proj": set()}
    modules = {"q_proj": model.model.layers[0].self_attn.q_proj}
    hooks = [
        m.register_forward_hook(lambda _m, _i, out, name=name: seen[name].add(out.dtype)) for name, m in modules.items()
    ]
    try:
        fn()
    finally:
        for h in hooks:
            h.remove()
    return seen


@pytest.mark.parametrize("forward", ["plain", "shared_prefix"])
def test_bf16_compute_runs_bf16_matmuls_and_keeps_fp32_weights_gradients_and_head(base_model, forward):
    records = shared_prefix_records(base_model.config.vocab_size)
    fp32, bf16 = copy.deepcopy(base_model), copy.deepcopy(base_model)
    Learner(fp32, PPOConfig(forward=forward)).compute_gradients(records)
    learner = Learner(bf16, PPOConfig(forward=forward, compute_dtype="bfloat16"))
    seen = _output_dtypes(bf16, lambda: learner.compute_gradients(records))
    assert seen == {"q_proj": {torch.bfloat16}}
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in bf16.parameters())
    g32, g16 = flat_grad(fp32), flat_grad(bf16)
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
    assert seen == {"q_proj": {torch.float32}}


def test_resolve_compute_dtype():
    assert resolve_compute_dtype("float32", device_type="cpu", weights=torch.float32) is None
    assert resolve_compute_dtype("bfloat16", device_type="cpu", weights=torch.float32) is torch.bfloat16
    # bf16 weights (models.dtype bfloat16) compute in bf16 already: no autocast, no fp32 master
    assert resolve_compute_dtype("bfloat16", device_type="cpu", weights=torch.bfloat16) is None
    native, _ = native_bf16("cpu")
    assert resolve_compute_dtype("auto", device_type="cpu", weights=torch.float32) is (
        torch.bfloat16 if native else None
    )


def test_compute_dtype_is_a_checked_config_field():
    with pytest.raises(ValueError, match="learner.compute_dtype must be one of"):
        PPOConfig(compute_dtype="half")


def test_head_dtype_compute_keeps_fp32_gradients_close_to_the_fp32_heads(base_model):
    records = shared_prefix_records(base_model.config.vocab_size)
    fp32_head, bf16_head = copy.deepcopy(base_model), copy.deepcopy(base_model)
    kept = Learner(fp32_head, PPOConfig(compute_dtype="bfloat16", forward="shared_prefix"))
    learner = Learner(bf16_head, PPOConfig(compute_dtype="bfloat16", forward="shared_prefix", head_dtype="compute"))
    learner.compute_gradients(records)
    kept.compute_gradients(records)
    g_kept, g_bf16 = flat_grad(fp32_head), flat_grad(bf16_head)
    assert all(p.grad.dtype == torch.float32 for p in bf16_head.parameters())
    assert not torch.equal(g_kept, g_bf16)
    assert float(torch.nn.functional.cosine_similarity(g_kept, g_bf16, dim=0)) > 0.99


@pytest.mark.parametrize("head_dtype", ["float32", "compute"])
def test_head_scores_under_autocast_follow_head_dtype(head_dtype):
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.randn(50, 16, generator=gen) * 2)
    hidden = torch.randn(7, 16, generator=gen) * 2
    targets, temps = torch.randint(0, 50, (7,), generator=gen), torch.full((7,), 0.7)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = head_scores(head, hidden, targets, temps, head_dtype=head_dtype)[:, 0]
    w = head.weight.detach()
    logits = hidden @ w.T if head_dtype == "float32" else (hidden.bfloat16() @ w.bfloat16().T).float()
    want = torch.log_softmax(logits / 0.7, -1).gather(-1, targets[:, None])[:, 0]
    other = hidden @ w.T if head_dtype == "compute" else (hidden.bfloat16() @ w.bfloat16().T).float()
    unwanted = torch.log_softmax(other / 0.7, -1).gather(-1, targets[:, None])[:, 0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0.0)
    assert float((got - unwanted).abs().max()) > 1e-3  # bf16 logits really differ at this scale


def test_head_dtype_is_moot_under_fp32_compute(base_model):
    records = shared_prefix_records(base_model.config.vocab_size)
    a, b = copy.deepcopy(base_model), copy.deepcopy(base_model)
    Learner(a, PPOConfig()).compute_gradients(records)
    Learner(b, PPOConfig(head_dtype="compute")).compute_gradients(records)
    assert torch.equal(flat_grad(a), flat_grad(b))


class _WeightCasts(TorchDispatchMode):
    """Counts the casts of the model's parameters to another dtype (autocast's weight copies)."""

    def __init__(self, model):
        super().__init__()
        self.params = {p.data_ptr() for p in model.parameters()}
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and args[0].data_ptr() in self.params:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_bf16_weight_copies_are_made_once_per_optimizer_step_and_change_nothing(base_model, monkeypatch):
    records = shared_prefix_records(base_model.config.vocab_size)
    config = PPOConfig(compute_dtype="bfloat16", forward="plain", micro_batch_size=1)
    assert len(records) >= 3  # three or more micro-batches share one set of copies

    def casts_and_grad(model):
        learner = Learner(model, config)
        with _WeightCasts(model) as casts:
            learner.compute_gradients(records)
        return casts.count, flat_grad(model)

    kept, g_kept = casts_and_grad(copy.deepcopy(base_model))
    monkeypatch.setattr(ppo, "keep_casts", lambda dtype, device_type: contextlib.nullcontext())
    each, g_each = casts_and_grad(copy.deepcopy(base_model))
    matrices = sum(1 for n, p in base_model.named_parameters() if p.dim() == 2 and "embed" not in n)
    assert 0 < kept <= matrices + 1 and each >= len(records) * kept - 1
    assert torch.equal(g_kept, g_each)  # the same copies, hence the same gradient bit for bit
