"""The learner under `batch_layout: reference` on a real tiny Llama: the gradient is verl's weighted sum of its
micro-batches' token-mean gradients, alone and on real gloo ranks, prefix trees included, and the optimizer
steps are verl's mini-batches; a CPU trainer step pads each model's records with copies before advantages."""

import copy

import numpy as np
import pytest
import test_distributed as dist_case
import torch
from transformers import AutoModelForCausalLM

from drmas_train.algorithm import advantages as adv_mod
from drmas_train.config import build_config
from drmas_train.learner import Learner, PPOConfig
from drmas_train.learner.layout import padding_multiple, reference_minibatches
from drmas_train.run.trainer import Trainer
from drmas_train.testing.tiny import build_tiny_model


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_torch_thread):
    """torch on one thread for this module (tests/conftest.py)."""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", arch="llama", seed=0))


def _grads(folder, records, **knobs):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    Learner(model, PPOConfig(forward="plain", **knobs)).compute_gradients(records)
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _verl_gradient(folder, records, world, micro):
    """sum over micro-batches u of g_u / (W x (mini // micro)), g_u the token-mean gradient of u alone."""
    config = PPOConfig(batch_layout="reference", micro_batch_size=micro)
    (mini,) = reference_minibatches(records, config, world, whole=True)
    total = 0
    for chunk in mini.chunks:
        total = total + _grads(folder, [records[i] for i in chunk], micro_batch_size=len(chunk))
    return total / mini.n_micro, mini


def test_one_process_gradient_is_the_reference_weighted_sum(folder):
    batch = dist_case.records(10, 256, seed=4)
    want, mini = _verl_gradient(folder, batch, 1, 4)
    assert [sorted(c) for c in mini.chunks] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] and mini.n_micro == 2
    got = _grads(folder, batch, batch_layout="reference", micro_batch_size=4, loss_agg="micro_token_mean")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-8)
    packed = _grads(folder, batch, micro_batch_size=4, loss_agg="micro_token_mean")
    assert not torch.allclose(packed, want, rtol=1e-3, atol=1e-6)  # the layout changes the gradient


def test_a_call_without_response_tokens_keeps_its_place_but_runs_in_no_pass(folder):
    batch = dist_case.records(8, 256, seed=7)
    batch[3].response_ids, batch[3].logprobs = [], []
    want, mini = _verl_gradient(folder, batch, 1, 4)
    assert [sorted(c) for c in mini.chunks] == [[0, 1, 2], [4, 5, 6, 7]] and mini.n_micro == 2
    got = _grads(folder, batch, batch_layout="reference", micro_batch_size=4, loss_agg="micro_token_mean")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-8)


def test_prefix_trees_pack_inside_the_reference_micro_batches(folder):
    batch = dist_case.shared_records(2, 3, seed=2)
    knobs = {"batch_layout": "reference", "micro_batch_size": 4, "loss_agg": "micro_token_mean"}
    plain = _grads(folder, batch, **knobs)
    knobs["forward"] = "shared_prefix"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    Learner(model, PPOConfig(**knobs)).compute_gradients(batch)
    tree = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    torch.testing.assert_close(tree, plain, rtol=1e-5, atol=1e-8)


def test_optimizer_steps_are_the_reference_mini_batches(folder):
    batch = dist_case.records(12, 256, seed=5)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    knobs = {"micro_batch_size": 2, "mini_batches": 5, "old_logprobs": "sampled", "forward": "plain"}
    packed = Learner(copy.deepcopy(model), PPOConfig(**knobs)).update(batch)
    ours = Learner(model, PPOConfig(batch_layout="reference", **knobs)).update(batch)
    # ceil(12 / 5) = 3 records per mini-batch: four optimizer steps, where packed takes five
    assert (packed["n_opt_steps"], ours["n_opt_steps"]) == (5, 4) and ours["n_samples"] == 12


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["replicate", "fsdp"])
def test_ranks_take_their_balanced_partitions(folder, tmp_path, strategy):
    batch = dist_case.records(8, 256, seed=6)
    want, mini = _verl_gradient(folder, batch, 2, 2)
    assert mini.n_micro == 4  # 4 records per rank, micro 2: accumulation 2, times 2 ranks
    ppo = {"batch_layout": "reference", "loss_agg": "micro_token_mean", "forward": "plain"}
    for got in dist_case.spawn(2, folder, batch, 2, False, tmp_path, strategy, ppo):
        flat = torch.cat([g.flatten() for g in got["grads"].values() if g is not None])
        torch.testing.assert_close(flat, want, rtol=1e-5, atol=1e-8)
        assert got["metrics"]["n_samples"] == 8


def test_a_trainer_step_pads_each_model_before_advantages(tmp_path):
    knobs = {"batch_layout": "reference", "micro_batch_size": 2, "logprob_micro_batch_size": 5}
    over = {"log.run_dir": str(tmp_path / "run"), "steps": 1, "eval.every": 0, "eval.before_train": False}
    cfg = build_config("smoke", {**over, **{f"learner.{k}": v for k, v in knobs.items()}})
    trainer = Trainer(cfg)
    seen = {}
    update = trainer.workers.update

    def spy_update(name, records):  # the real update, its records kept
        seen[name] = list(records)
        return update(name, records)

    trainer.workers.update = spy_update
    batch = trainer.next_batch()  # the batch the step trains on
    row = trainer.train_step()
    trained = seen["shared"]
    n = len(batch.records)
    multiple = padding_multiple(1, 2, 5)
    assert len(trained) % multiple == 0 and n < len(trained) < n + multiple  # copies were made
    assert [r.response_ids for r in trained[:n]] == [r.response_ids for r in batch.records]
    originals = {(r.episode_id, r.turn): r for r in trained[:n]}
    for c in trained[n:]:  # each copy is a record of the step, with its advantage
        assert c.response_ids == originals[(c.episode_id, c.turn)].response_ids
        assert c.advantage == originals[(c.episode_id, c.turn)].advantage
    # the copies counted in the per-(group, agent) statistics: the advantages are those of the padded batch
    ids = {
        "group_ids": np.array([r.group_id for r in trained]),
        "agent_ids": np.array([r.agent for r in trained]),
        "episode_ids": np.array([r.episode_id for r in trained]),
    }
    rewards = np.array([r.reward for r in trained])
    want = adv_mod.compute_advantages(rewards, **ids, estimator=cfg.algo.estimator, norm_by_std=cfg.algo.norm_by_std)
    np.testing.assert_allclose([r.advantage for r in trained], want, rtol=1e-12)
    assert row["learner/shared/n_samples"] == sum(1 for r in trained if r.response_ids)
    trainer.close()
