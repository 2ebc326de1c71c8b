"""Data-parallel learner on real gloo process groups: W ranks give the one-process gradient and step.

Each case spawns W real processes joined over TCP on loopback (torch.distributed, gloo), every rank
loading the same tiny Llama and getting the same records; the ranks' gradients, metrics and
post-step weights are compared with one process doing the whole batch. Tolerance 1e-5 relative
(weights: 1e-6 absolute, lr / 1000): only the float summation order differs.
"""

import math

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from drmas_train.distributed import DataParallel, _buckets, join, rendezvous_address
from drmas_train.learner import Learner, PPOConfig, lora_param_groups
from drmas_train.models.tiny import build_tiny_model
from drmas_train.records import CallRecord

pytestmark = pytest.mark.slow


def records(n: int, vocab: int, *, adapters=(None,), seed: int = 0) -> list[CallRecord]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p_len, r_len = torch.randint(1, 12, (2,), generator=g).tolist()
        out.append(
            CallRecord(
                group_id=0,
                episode_id=i,
                agent="solver",
                model="m",
                turn=0,
                prompt_ids=torch.randint(5, vocab, (p_len,), generator=g).tolist(),
                response_ids=torch.randint(5, vocab, (r_len,), generator=g).tolist(),
                logprobs=[0.0] * r_len,
                advantage=float(torch.randn(1, generator=g)),
                adapter=adapters[i % len(adapters)],
            )
        )
    return out


def make_learner(folder, micro: int, *, lora: bool, dp=None) -> Learner:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    config = PPOConfig(lr=1e-3, micro_batch_size=micro)
    if not lora:
        return Learner(model, config, dp=dp)
    from peft import LoraConfig, get_peft_model

    lcfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, init_lora_weights=False)
    model = get_peft_model(model, lcfg, adapter_name="a")
    model.add_adapter("b", lcfg)
    return Learner(model, config, param_groups=lora_param_groups(model, 1e-3), dp=dp)


def run_case(folder, batch, micro: int, lora: bool, dp=None) -> dict:
    """Gradients of the whole batch, then one optimizer step's metrics and weights."""
    learner = make_learner(folder, micro, lora=lora, dp=dp)
    if dp is not None:
        dp.broadcast_module(learner.model)
    learner.compute_gradients(batch)
    grads = {n: (None if p.grad is None else p.grad.clone()) for n, p in learner.model.named_parameters()}
    learner.optimizer.zero_grad(set_to_none=True)
    metrics = learner.update(batch)
    weights = {n: p.detach().clone() for n, p in learner.model.named_parameters() if p.requires_grad}
    return {"grads": grads, "metrics": metrics, "weights": weights}


def _rank_main(rank, world, port, folder, batch, micro, lora, out_dir):
    torch.set_num_threads(1)
    dp = join(rank, world, "127.0.0.1", port, timeout_s=120)
    torch.save(run_case(folder, batch, micro, lora, dp), f"{out_dir}/rank{rank}.pt")
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", arch="llama", seed=0))


def spawn(world, folder, batch, micro, lora, tmp_path) -> list[dict]:
    _, port = rendezvous_address()
    mp.spawn(_rank_main, args=(world, port, folder, batch, micro, lora, str(tmp_path)), nprocs=world, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]


def assert_close_dicts(got, ref, atol=1e-7):
    assert got.keys() == ref.keys()
    for k in ref:
        if ref[k] is None:
            assert got[k] is None, k  # untouched everywhere stays untouched (AdamW skips it)
        else:
            torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=atol, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize(
    ("world", "n", "micro", "lora"),
    [
        (2, 7, 2, False),  # 4 micro-batches on 2 ranks
        (3, 5, 4, False),  # 2 micro-batches on 3 ranks: rank 2 computes nothing and still agrees
        (2, 6, 2, True),  # LoRA: adapter "b" gets no records, so its grads stay None on every rank
    ],
)
def test_ranks_reproduce_the_single_process_gradient_metrics_and_step(folder, tmp_path, world, n, micro, lora):
    torch.set_num_threads(1)
    batch = records(n, 256, adapters=("a",) if lora else (None,), seed=n)
    ref = run_case(folder, batch, micro, lora)
    assert any(g is not None and float(g.abs().sum()) > 0 for g in ref["grads"].values())
    ranks = spawn(world, folder, batch, micro, lora, tmp_path)
    for got in ranks:
        assert_close_dicts(got["grads"], ref["grads"])
        # Adam's first step moves a weight by lr * g / (|g| + eps): for |g| near eps a 1e-7 relative
        # difference in g shows, so the weights get an absolute tolerance of lr / 1000.
        assert_close_dicts(got["weights"], ref["weights"], atol=1e-6)
        assert got["metrics"].keys() == ref["metrics"].keys()
        for k, v in ref["metrics"].items():
            assert math.isclose(got["metrics"][k], v, rel_tol=1e-5, abs_tol=1e-7), k
    if lora:
        assert all(g is None for name, g in ref["grads"].items() if ".b." in name and "lora_" in name)


def test_shard_and_buckets():
    dp = DataParallel(rank=1, world_size=3)
    assert dp.shard(list(range(8))) == [1, 4, 7]
    assert DataParallel(rank=2, world_size=3).shard([0, 1]) == []
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (3, 5, 2)]
    import drmas_train.distributed as d

    before, d.BUCKET_ELEMENTS = d.BUCKET_ELEMENTS, 8
    try:
        assert [[p.numel() for p in b] for b in _buckets(params)] == [[3, 5], [2]]
    finally:
        d.BUCKET_ELEMENTS = before
