"""Data-parallel learner on real gloo process groups: W ranks give the one-process gradient and step.

Each case spawns W real processes joined over TCP on loopback (torch.distributed, gloo), every rank
loading the same tiny Llama and getting the same records; the ranks' gradients, metrics, post-step
weights and optimizer state are compared with one process doing the whole batch. Tolerance 1e-5
relative (weights: 1e-5 absolute, lr / 100): only the float summation order differs. Both
strategies run: "replicate" (all-reduce) and "fsdp" (FSDP2 shards, gathered whole for comparison).
"""

import copy
import math

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from drmas_train.algorithm.records import CallRecord
from drmas_train.learner import Learner, PPOConfig, lora_param_groups
from drmas_train.learner.distributed import (
    DataParallel,
    _buckets,
    decoder_layers,
    full_state_dict,
    full_tensor,
    join,
    load_full_state_dict,
    rendezvous_address,
    shard_module,
)
from drmas_train.testing.tiny import build_tiny_model

pytestmark = pytest.mark.slow
# The ranks fork from one server that imported torch, transformers and this module once for every case,
# rather than each rank of each case importing them again (most of a case's time on two cores).
mp.set_forkserver_preload(["torch", "transformers", __name__])


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


def shared_records(n_groups: int, group: int, *, adapters=(None,), seed: int = 0) -> list[CallRecord]:
    """Records as a GRPO step makes them: per agent a system prompt, `group` samples of each question."""
    g = torch.Generator().manual_seed(seed)

    def ids(k: int) -> list[int]:
        return torch.randint(5, 256, (k,), generator=g).tolist()

    systems = [ids(15), ids(22)]
    out = []
    for q in range(n_groups):
        question = ids(5 + q)
        for j in range(group * len(systems)):
            response = ids(int(torch.randint(1, 10, (1,), generator=g)))
            out.append(
                CallRecord(
                    group_id=q,
                    episode_id=len(out),
                    agent="solver",
                    model="m",
                    turn=0,
                    prompt_ids=systems[j % 2] + question,
                    response_ids=response,
                    logprobs=[0.0] * len(response),
                    advantage=float(torch.randn(1, generator=g)),
                    adapter=adapters[j % len(adapters)],
                    temperature=0.7 if j % 2 else 1.0,
                )
            )
    return out


def make_learner(folder, micro: int, *, lora: bool, dp=None, ppo=None) -> Learner:
    """A learner with `ppo` config overrides; with KL and no LoRA, a frozen reference copy (sharded too)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    config = PPOConfig(lr=1e-3, micro_batch_size=micro, **(ppo or {}))
    ref = None
    if config.kl_coef > 0 and not lora:  # FSDP forbids deepcopy: copy before sharding
        ref = copy.deepcopy(model).eval().requires_grad_(False)
        if dp is not None and dp.sharded:
            shard_module(ref, dp)
    if lora:
        from peft import LoraConfig, get_peft_model

        lcfg = LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, init_lora_weights=False
        )
        model = get_peft_model(model, lcfg, adapter_name="a")
        model.add_adapter("b", lcfg)
    if dp is not None and dp.sharded:
        shard_module(model, dp)  # before the param groups: sharding replaces the parameters
    groups = lora_param_groups(model, 1e-3) if lora else None
    return Learner(model, config, param_groups=groups, ref_model=ref, dp=dp)


def run_case(folder, batch, micro: int, lora: bool, dp=None, ppo=None) -> dict:
    """Gradients of the whole batch, then one update's metrics, weights and optimizer state.

    Under FSDP every tensor is gathered whole on every rank (collectives, in the same order).
    The optimizer state is also loaded into a fresh learner and read back (the round trip).
    """
    learner = make_learner(folder, micro, lora=lora, dp=dp, ppo=ppo)
    if dp is not None and not dp.sharded:
        dp.broadcast_module(learner.model)
    learner.compute_gradients(batch)
    grads = {n: (None if p.grad is None else full_tensor(p.grad).clone()) for n, p in learner.model.named_parameters()}
    learner.optimizer.zero_grad(set_to_none=True)
    metrics = learner.update(batch)
    if (ppo or {}).get("optimizer_offload"):  # a second update moves the offloaded state back in, then out
        metrics = learner.update(batch)
        assert [d for d, _ in learner.optimizer_moves] == ["in", "out", "in", "out"]
        assert learner.optimizer_moves[2][1] == learner.optimizer_moves[3][1] > 0
    trained = {id(p) for p in learner.params}
    named = learner.model.named_parameters()
    weights = {n: full_tensor(p.detach()).clone() for n, p in named if id(p) in trained}
    state = learner.state_dict()
    fresh = make_learner(folder, micro, lora=lora, dp=dp, ppo=ppo)
    fresh.load_state_dict(state)
    reloaded = fresh.state_dict()
    full = full_state_dict(learner.model)  # what the engine sync and checkpoints read
    load_full_state_dict(fresh.model, full)
    out = {"grads": grads, "metrics": metrics, "weights": weights, "state": state, "reloaded": reloaded}
    return out | {"full": full, "full_reloaded": full_state_dict(fresh.model)}


def _rank_main(rank, world, port, folder, batch, micro, lora, strategy, ppo, out_dir):
    torch.set_num_threads(1)
    dp = join(rank, world, "127.0.0.1", port, timeout_s=120, strategy=strategy)
    torch.save(run_case(folder, batch, micro, lora, dp, ppo), f"{out_dir}/rank{rank}.pt")
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", arch="llama", seed=0))


def spawn(world, folder, batch, micro, lora, tmp_path, strategy="replicate", ppo=None) -> list[dict]:
    _, port = rendezvous_address()
    args = (world, port, folder, batch, micro, lora, strategy, ppo, str(tmp_path))
    mp.start_processes(_rank_main, args=args, nprocs=world, join=True, start_method="forkserver")
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]


def assert_close_dicts(got, ref, atol=1e-7):
    assert got.keys() == ref.keys()
    for k in ref:
        if ref[k] is None:
            assert got[k] is None, k  # untouched everywhere stays untouched (AdamW skips it)
        else:
            torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=atol, msg=lambda m, k=k: f"{k}: {m}")


def assert_same_optimizer_state(got, ref):
    assert got["param_groups"] == ref["param_groups"]
    assert got["state"].keys() == ref["state"].keys()  # untouched parameters have no state anywhere
    for i, entry in ref["state"].items():
        assert_close_dicts(got["state"][i], entry)


KL = {"kl_coef": 0.1}
WEIGHT_ATOL = 1e-5  # lr / 100 (the test learner's lr is 1e-3): see the step check below


@pytest.mark.parametrize(
    ("world", "n", "micro", "adapters", "strategy", "ppo"),
    [
        (2, 7, 2, (None,), "replicate", None),  # 4 micro-batches on 2 ranks
        (3, 5, 4, (None,), "replicate", None),  # 2 micro-batches on 3 ranks: rank 2 computes nothing, still agrees
        (2, 6, 2, ("a",), "replicate", None),  # LoRA: adapter "b" gets no records: its grads stay None everywhere
        (2, 7, 2, (None,), "fsdp", None),  # 4 micro-batches on 2 sharded ranks
        (2, 5, 2, (None,), "fsdp", {"gradient_checkpointing": True}),  # as the GPU presets train
        # 2 micro-batches on 3 ranks: rank 2 runs a zero-weight pass (FSDP's collectives need it);
        # two mini-batches also take the recomputed old log-probs and two optimizer steps, and the
        # KL term a sharded reference model, whose forward the padding pass must run too.
        (3, 5, 4, (None,), "fsdp", {"mini_batches": 2, **KL}),
        # LoRA, 3 micro-batches: a padding pass, "b" stays None; KL through peft's disabled adapters.
        (2, 5, 2, ("a",), "fsdp", KL),
        (2, 6, 3, ("a", "b"), "fsdp", None),  # LoRA: rank 0 trains adapter "a" while rank 1 trains "b"
        # AdamW's state on the host between updates: each rank moves its shard (DTensors; a replica moves
        # as one process's state does, tested in test_learner).
        (2, 7, 2, (None,), "fsdp", {"optimizer_offload": True, "mini_batches": 2}),
    ],
)
def test_ranks_reproduce_the_single_process_gradient_metrics_and_step(
    folder, tmp_path, world, n, micro, adapters, strategy, ppo
):
    torch.set_num_threads(1)
    lora = adapters != (None,)
    batch = records(n, 256, adapters=adapters, seed=n)
    ref = run_case(folder, batch, micro, lora, ppo=ppo)
    assert any(g is not None and float(g.abs().sum()) > 0 for g in ref["grads"].values())
    ranks = spawn(world, folder, batch, micro, lora, tmp_path, strategy, ppo)
    for got in ranks:
        assert_close_dicts(got["grads"], ref["grads"])
        # Adam's first step moves a weight by lr * g / (|g| + eps), whose slope at |g| = eps is lr / (4 eps):
        # there a gradient difference far inside the gradient tolerance (1e-10) moves the weight by 2.5e-6.
        # Such elements are rare (1 in 16,384 on an AMX Xeon, off by 3.4e-6), so the weights get an
        # absolute tolerance of lr / 100.
        assert_close_dicts(got["weights"], ref["weights"], atol=WEIGHT_ATOL)
        assert got["metrics"].keys() == ref["metrics"].keys()
        for k, v in ref["metrics"].items():
            assert math.isclose(got["metrics"][k], v, rel_tol=1e-5, abs_tol=1e-7), k
        assert_same_optimizer_state(got["state"]["optimizer"], ref["state"]["optimizer"])
        assert_same_optimizer_state(got["reloaded"]["optimizer"], got["state"]["optimizer"])
        assert_close_dicts({k: got["full"][k] for k in ref["weights"]}, ref["weights"], atol=WEIGHT_ATOL)
        assert_close_dicts(got["full_reloaded"], got["full"])
    if "b" not in adapters and lora:
        assert all(g is None for name, g in ref["grads"].items() if ".b." in name and "lora_" in name)


@pytest.mark.parametrize("adapters", [(None,), ("a", "b")], ids=["full", "lora"])
def test_fsdp_shared_prefix_gradients_equal_the_unshared_ones(folder, tmp_path, adapters):
    """FSDP ranks packing prefix trees (and LM-head chunks recomputed in backward) vs one plain process."""
    torch.set_num_threads(1)
    lora = adapters != (None,)
    batch = shared_records(2, 3, adapters=adapters, seed=1)
    ref = run_case(folder, batch, 4, lora, ppo={"forward": "plain"})
    ppo = {"forward": "shared_prefix", "logits_chunk_mib": 0.01}  # a few positions per LM-head chunk
    for got in spawn(2, folder, batch, 4, lora, tmp_path, "fsdp", ppo):
        assert got["grads"].keys() == ref["grads"].keys()
        for name, want in ref["grads"].items():
            if want is None:
                assert got["grads"][name] is None, name
                continue
            rel = float((got["grads"][name] - want).norm() / want.norm().clamp_min(1e-30))
            assert rel <= 1e-5, f"{name}: relative difference {rel:.2e}"
        for k, v in ref["metrics"].items():
            assert math.isclose(got["metrics"][k], v, rel_tol=1e-5, abs_tol=1e-7), k


def test_shard_and_buckets():
    dp = DataParallel(rank=1, world_size=3)
    assert dp.shard(list(range(8))) == [1, 4, 7]
    assert DataParallel(rank=2, world_size=3).shard([0, 1]) == []
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (3, 5, 2)]
    import drmas_train.learner.distributed as d

    before, d.BUCKET_ELEMENTS = d.BUCKET_ELEMENTS, 8
    try:
        assert [[p.numel() for p in b] for b in _buckets(params)] == [[3, 5], [2]]
    finally:
        d.BUCKET_ELEMENTS = before


def test_fsdp_learner_needs_a_sharded_model(folder):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with pytest.raises(ValueError, match="shard_module"):
        Learner(model, PPOConfig(), dp=DataParallel(rank=0, world_size=2, strategy="fsdp"))


def test_decoder_layers_are_found_in_plain_and_peft_models(folder):
    from peft import LoraConfig, get_peft_model

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    layers = decoder_layers(model)
    assert layers == list(model.model.layers)
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    assert decoder_layers(peft_model) == layers
    assert decoder_layers(torch.nn.Linear(2, 2)) == []
    with pytest.raises(ValueError, match="strategy"):
        DataParallel(rank=0, world_size=1, strategy="zero3")
