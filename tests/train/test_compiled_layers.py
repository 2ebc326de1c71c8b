"""`learner.compile_layers`: torch.compile'd decoder layers inside the learner's passes only."""

import copy

import pytest
import torch
from batches import shared_prefix_records
from transformers import AutoModelForCausalLM

from drmas_train.config import PPOConfig
from drmas_train.learner import Learner
from drmas_train.learner.compiled import CompiledLayers, check_compiler
from drmas_train.testing.tiny import build_tiny_model

pytestmark = pytest.mark.xdist_group("torch_compile")  # one compile at a time on a 2-core runner


def _has_compiler() -> bool:
    try:
        check_compiler("cpu")
    except RuntimeError:
        return False
    return True


needs_compiler = pytest.mark.skipif(not _has_compiler(), reason="no C++ compiler: inductor cannot build CPU kernels")


@pytest.fixture(scope="module")
def base_model(tmp_path_factory):
    folder = build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", arch="llama", seed=0)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@needs_compiler
@pytest.mark.parametrize("forward", ["plain", "shared_prefix"])
def test_compiled_layers_give_the_eager_gradient_and_leave_the_module_tree_as_it_was(base_model, forward):
    records = shared_prefix_records(base_model.config.vocab_size, 6, seed=1)
    eager, compiled = copy.deepcopy(base_model), copy.deepcopy(base_model)
    Learner(eager, PPOConfig(forward=forward)).compute_gradients(records)
    learner = Learner(compiled, PPOConfig(forward=forward, compile_layers=True))
    keys = list(compiled.state_dict())
    seen = []
    hook = compiled.model.register_forward_pre_hook(lambda m, _a: seen.append(type(m.layers[0]).__name__))
    try:
        learner.compute_gradients(records)
    finally:
        hook.remove()
    assert seen and set(seen) == {"OptimizedModule"}  # the compiled twins ran every pass
    assert all(type(layer).__name__ != "OptimizedModule" for layer in compiled.model.layers)
    assert list(compiled.state_dict()) == keys
    g_eager, g_compiled = _grads(eager), _grads(compiled)
    assert g_eager.keys() == g_compiled.keys()
    for name, g in g_eager.items():
        torch.testing.assert_close(g_compiled[name], g, rtol=1e-4, atol=1e-6, msg=name)
    # outside the learner the model runs eager (e.g. the transformers backend generating with a KV cache)
    out = compiled.generate(torch.tensor([records[0].prompt_ids]), max_new_tokens=3, do_sample=False)
    assert out.shape[1] == len(records[0].prompt_ids) + 3


@needs_compiler
def test_one_graph_serves_every_length_and_updates_train(base_model):
    torch._dynamo.reset()
    model = copy.deepcopy(base_model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    # one packed row per update (batch size 1): only the length changes between updates
    learner = Learner(model, PPOConfig(lr=1e-3, compile_layers=True, forward="shared_prefix", micro_batch_size=8))
    learner.update(shared_prefix_records(model.config.vocab_size, 4, seed=2))
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for seed in (3, 4):  # other prompt and response lengths: no recompilation
        out = learner.update(shared_prefix_records(model.config.vocab_size, 5, seed=seed))
        assert out["skipped"] == 0 and out["grad_norm"] > 0
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_compile_layers_refuses_gradient_checkpointing_and_a_model_without_decoder_layers():
    with pytest.raises(ValueError, match="cannot be combined"):
        PPOConfig(compile_layers=True, gradient_checkpointing=True)
    with pytest.raises(ValueError, match="get_decoder"):
        CompiledLayers(torch.nn.Linear(2, 2))


def test_a_cpu_without_a_cpp_compiler_is_told_before_the_first_update(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr("shutil.which", lambda _name: None)
    with pytest.raises(RuntimeError, match="C\\+\\+ compiler"):
        check_compiler("cpu")
    check_compiler("cuda")  # GPUs compile with triton, not a host C++ compiler
