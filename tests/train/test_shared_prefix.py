"""Shared-prefix forward/backward: a micro-batch packed as a prefix tree gives the unshared gradients.

Every comparison is per tensor: ||g_shared - g_plain|| / ||g_plain|| <= 1e-5 in fp32, on real tiny
Llama and Qwen2 models with SDPA (and eager) attention, for one shared model, two per-agent models,
LoRA adapters and gradient checkpointing; FSDP is in test_distributed.py. A smoke run's metrics with
and without sharing agree within 1e-5.
"""

import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from drmas_train.algorithm.records import CallRecord
from drmas_train.learner import Learner, PPOConfig, lora_param_groups
from drmas_train.learner.forward import choose_forward, score
from drmas_train.learner.prefix_tree import pack_prefix_tree, tree_length
from drmas_train.testing.tiny import build_tiny_model

REL = 1e-5
pytestmark = pytest.mark.numerics  # packed and plain forwards compared: their rounding depends on the kernels


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_torch_thread):
    """torch on one thread for this module (tests/conftest.py)."""


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {arch: build_tiny_model(root / arch, arch=arch, seed=0) for arch in ("llama", "qwen2")}


def load(folder, **kwargs):
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kwargs).eval()


def team_records(*, groups=3, n=4, seed=0, agents=("solver", "verifier"), adapters=None, temps=(0.7, 1.0)):
    """GRPO-shaped records: per agent a system prompt, per group a question, n sampled responses each.

    Responses sometimes start alike, so the tree shares response tokens too; lengths vary.
    """
    g = torch.Generator().manual_seed(seed)

    def ids(k):
        return torch.randint(5, 256, (k,), generator=g).tolist()  # inside every tiny vocabulary

    systems = {a: ids(18 + 7 * i) for i, a in enumerate(agents)}
    out = []
    for group in range(groups):
        question = ids(6 + group)
        for j in range(n):
            for i, agent in enumerate(agents):
                head = [7, 8] if j % 2 else []
                response = head + ids(int(torch.randint(1, 12, (1,), generator=g)))
                out.append(
                    CallRecord(
                        group_id=group,
                        episode_id=group * n + j,
                        agent=agent,
                        model="m",
                        turn=i,
                        prompt_ids=systems[agent] + question,
                        response_ids=response,
                        logprobs=[0.0] * len(response),
                        advantage=float(torch.randn(1, generator=g)),
                        adapter=None if adapters is None else adapters[i],
                        temperature=temps[i % len(temps)],
                    )
                )
    return out


def grads_of(model, records, forward, **ppo):
    model = copy.deepcopy(model)
    groups = lora_param_groups(model, 1e-3) if hasattr(model, "peft_config") else None
    learner = Learner(model, PPOConfig(forward=forward, **ppo), param_groups=groups)
    metrics = learner.compute_gradients(records)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, metrics


def assert_same_gradients(model, records, **ppo):
    plain, m_plain = grads_of(model, records, "plain", **ppo)
    shared, m_shared = grads_of(model, records, "shared_prefix", **ppo)
    assert plain.keys() == shared.keys() and plain
    for name, ref in plain.items():
        rel = float((shared[name] - ref).norm() / ref.norm().clamp_min(1e-30))
        assert rel <= REL, f"{name}: relative difference {rel:.2e}"
    for key in ("loss", "entropy", "n_tokens"):
        assert math.isclose(m_shared[key], m_plain[key], rel_tol=REL, abs_tol=1e-7), key


def test_prefix_tree_shares_prefixes_and_indexes_the_responses():
    prompts = [[1, 2, 3], [1, 2, 3], [1, 2, 9], [4]]
    responses = [[5, 6], [5, 7, 8], [5], [6]]
    row = pack_prefix_tree(prompts, responses)
    # inputs (prompt + response[:-1]): 1 2 3 5 | 1 2 3 5 7 | 1 2 9 | 4  ->  nodes 1 2 3 5 7 9 4
    assert row.input_ids[0].tolist() == [1, 2, 3, 5, 7, 9, 4]
    assert row.position_ids[0].tolist() == [0, 1, 2, 3, 4, 2, 0]
    assert row.length == tree_length(prompts, responses) == 7
    assert row.targets.tolist() == [5, 6, 5, 7, 8, 5, 6]
    assert row.predict.tolist() == [2, 3, 2, 3, 4, 5, 6]  # the node before each response token
    assert list(zip(row.rows.tolist(), row.cols.tolist())) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (2, 0), (3, 0)]
    mask = row.ancestor_mask()
    assert mask[4].tolist() == [True, True, True, True, True, False, False]  # 7 sees 1 2 3 5 and itself
    assert mask[5].tolist() == [True, True, False, False, False, True, False]  # 9 sees 1 2, not 3 / 5
    assert mask[6].tolist() == [False] * 6 + [True]  # 4 is a root of its own
    with pytest.raises(ValueError, match="at least one token"):
        pack_prefix_tree([[]], [[1]])


def test_a_padded_tree_keeps_its_nodes_and_hides_the_padding():
    prompts, responses = [[1, 2, 3], [1, 2, 9]], [[5, 6], [5]]
    row = pack_prefix_tree(prompts, responses)
    padded = row.padded(8, pad_id=0)
    assert (row.length, padded.length, padded.pad) == (5, 8, 3)
    assert padded.input_ids[0].tolist() == row.input_ids[0].tolist() + [0, 0, 0]
    for field in ("predict", "rows", "cols", "targets"):
        assert torch.equal(getattr(padded, field), getattr(row, field))
    mask = padded.ancestor_mask()
    assert torch.equal(mask[:5, :5], row.ancestor_mask())
    assert not mask[:5, 5:].any()  # no real node sees the padding
    assert torch.equal(mask[5:, :], torch.eye(8, dtype=torch.bool)[5:])  # each pad sees only itself
    assert padded.padded(8, pad_id=0) is padded and row.padded(1, pad_id=0) is row


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_padded_trees_give_the_gradients_of_plain_rows(folders, attn):
    model = load(folders["llama"], attn_implementation=attn)
    assert_same_gradients(model, team_records(seed=3), micro_batch_size=8, tree_multiple=32)
    lengths = []  # and the forward really ran padded rows
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: lengths.append(i[0].shape[1]))
    with torch.no_grad():
        score(model, team_records(seed=3)[:8], forward="shared_prefix", tree_multiple=32)
    hook.remove()
    assert lengths and all(n % 32 == 0 for n in lengths), lengths


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logprobs_equal_unpadded_forwards(folders, arch, attn):
    """The installed transformers takes a user 4D mask as is (SDPA: bool, eager: additive)."""
    model = load(folders[arch], attn_implementation=attn)
    assert model.config._attn_implementation == attn
    records = team_records(groups=2, n=3)
    with torch.no_grad():
        out = score(model, records, forward="shared_prefix", entropy="metric")
        for i, r in enumerate(records):
            logits = model(torch.tensor([r.prompt_ids + r.response_ids])).logits[0, len(r.prompt_ids) - 1 : -1]
            logp = torch.log_softmax(logits / r.score_temperature, -1)
            want = logp.gather(1, torch.tensor(r.response_ids)[:, None])[:, 0]
            n = len(r.response_ids)
            torch.testing.assert_close(out.logp[i, :n], want, atol=1e-5, rtol=0)
            torch.testing.assert_close(out.entropy[i, :n], -(logp.exp() * logp).sum(-1), atol=1e-5, rtol=0)
            assert out.mask[i].sum() == n
    prompts, responses = [r.prompt_ids for r in records], [r.response_ids for r in records]
    unshared = sum(len(p) + len(r) - 1 for p, r in zip(prompts, responses))
    assert tree_length(prompts, responses) < 0.5 * unshared  # so the packing really shares


def test_shared_model_gradients_equal(folders):
    assert_same_gradients(load(folders["llama"]), team_records(), micro_batch_size=8)


def test_shared_model_gradients_equal_with_checkpointing_kl_and_entropy(folders):
    ppo = dict(micro_batch_size=5, gradient_checkpointing=True, kl_coef=0.1, entropy_coef=0.01)
    assert_same_gradients(load(folders["qwen2"]), team_records(seed=1), **ppo)


def test_per_agent_models_gradients_equal(folders):
    """Two agents, two models (per_agent assignment): each learner sees its own agent's records."""
    records = team_records(seed=2)
    for agent, arch in (("solver", "llama"), ("verifier", "qwen2")):
        assert_same_gradients(load(folders[arch]), [r for r in records if r.agent == agent], micro_batch_size=6)


def test_lora_adapters_gradients_equal(folders):
    from peft import LoraConfig, get_peft_model

    lcfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(load(folders["llama"]), lcfg, adapter_name="solver")
    model.add_adapter("verifier", lcfg)
    assert_same_gradients(model, team_records(seed=3, adapters=("solver", "verifier")), micro_batch_size=6)


def test_auto_packs_only_micro_batches_that_share(folders):
    model = load(folders["llama"])
    shared = team_records(groups=1, n=4, agents=("solver",))
    assert choose_forward(model, shared, "auto") == "shared_prefix"
    unrelated = team_records(groups=1, n=1, agents=("a", "b", "c"), seed=5)  # three system prompts: no prefix
    assert choose_forward(model, unrelated, "auto") == "plain"
    flash = load(folders["llama"])
    flash.config._attn_implementation = "flash_attention_2"  # only read, never run
    assert choose_forward(flash, shared, "auto") == "plain"
    with pytest.raises(ValueError, match="SDPA or eager"):
        choose_forward(flash, shared, "shared_prefix")
    with pytest.raises(ValueError, match="forward"):
        PPOConfig(forward="tree")


def test_smoke_run_metrics_equal_with_and_without_sharing(tmp_path):
    from drmas_train.config import build_config
    from drmas_train.run.trainer import Trainer

    rows = {}
    for forward in ("plain", "shared_prefix"):
        over = {"log.run_dir": str(tmp_path / forward), "learner.forward": forward, "log.tensorboard": False}
        rows[forward] = Trainer(build_config("smoke", over)).train()
    assert len(rows["plain"]) == len(rows["shared_prefix"]) == 2
    for plain, shared in zip(rows["plain"], rows["shared_prefix"]):
        clocks = ("time/", "mem/", "tokens/per_s")  # wall clock and memory: measured, not computed
        keys = [k for k, v in plain.items() if isinstance(v, (int, float)) and not k.startswith(clocks)]
        assert "grad_norm/shared" in keys and "learner/shared/loss" in keys
        for k in keys:
            assert math.isclose(shared[k], plain[k], rel_tol=REL, abs_tol=1e-6), (k, shared[k], plain[k])
