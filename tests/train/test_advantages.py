"""Advantage estimators against hand-computed numbers.

The main fixture is one prompt group of three episodes. Agent `s` is called twice per episode,
agent `v` once (rows in call order s, s, v per episode):

    episode 0: s 0, s 2, v 1   -> episode score (0 + 2 + 1) / 3 = 1
    episode 1: s 1, s 1, v 4   -> score 2
    episode 2: s 2, s 0, v 7   -> score 3

Hand derivations (std is the unbiased n - 1 std; eps = 1e-6 is added to it):
- drmas, agent s: samples 0 2 1 1 2 0, mean 1, deviations -1 1 0 0 1 -1, sum of squares 4,
  var 4/5, std 2/sqrt(5) ~ 0.894427 -> A = +-1 / 0.894427 = +-sqrt(5)/2 ~ +-1.118034, or 0.
- drmas, agent v: samples 1 4 7, mean 4, deviations -3 0 3, var 18/2 = 9, std 3 -> A = -1 0 1.
- grpo: scores 1 2 3, mean 2, var 2/2 = 1, std 1 -> A = -1 0 1 per episode, for every call in it.
- pooled: all nine calls 0 2 1 1 1 4 2 0 7, mean 2, deviations -2 0 -1 -1 -1 2 0 -2 5,
  sum of squares 40, var 40/8 = 5, std sqrt(5) ~ 2.236068 -> A = deviation / 2.236068.
- rloo: scores 1 2 3 -> 1 - (2+3)/2 = -1.5, 2 - (1+3)/2 = 0, 3 - (1+2)/2 = 1.5.
"""

import math

import numpy as np
import pytest
import torch

from drmas_train.algorithm.advantages import ESTIMATORS, advantage_stats, agent_moments, compute_advantages

R = [0.0, 2.0, 1.0, 1.0, 1.0, 4.0, 2.0, 0.0, 7.0]
G = [0] * 9
A = ["s", "s", "v"] * 3
E = [0, 0, 0, 1, 1, 1, 2, 2, 2]
IDS = {"group_ids": G, "agent_ids": A, "episode_ids": E}
EPS = 1e-6


def adv(estimator, rewards=R, norm_by_std=True, **ids):
    return compute_advantages(rewards, **(ids or IDS), estimator=estimator, norm_by_std=norm_by_std)


def test_drmas_by_hand_agent_called_twice_per_episode():
    k = 1 / (2 / math.sqrt(5) + EPS)  # ~ 1.118034
    v = 3 / (3 + EPS)  # deviation 3 over std 3
    expected = [-k, k, -v, 0, 0, 0, k, -k, v]
    np.testing.assert_allclose(adv("drmas"), expected, rtol=1e-9, atol=1e-12)
    assert k == pytest.approx(math.sqrt(5) / 2, rel=1e-5)


def test_grpo_by_hand_episode_scores():
    u = 1 / (1 + EPS)
    np.testing.assert_allclose(adv("grpo"), [-u] * 3 + [0] * 3 + [u] * 3, rtol=1e-9, atol=1e-12)


def test_pooled_by_hand_all_calls_one_baseline():
    dev = [-2, 0, -1, -1, -1, 2, 0, -2, 5]
    np.testing.assert_allclose(adv("pooled"), [d / (math.sqrt(5) + EPS) for d in dev], rtol=1e-9)


def test_rloo_by_hand_and_ignores_std():
    expected = [-1.5] * 3 + [0.0] * 3 + [1.5] * 3
    np.testing.assert_allclose(adv("rloo"), expected, rtol=1e-12)
    np.testing.assert_allclose(adv("rloo", norm_by_std=False), expected, rtol=1e-12)


def test_norm_by_std_false_subtracts_mean_only():
    np.testing.assert_allclose(adv("drmas", norm_by_std=False), [-1, 1, -3, 0, 0, 0, 1, -1, 3], atol=1e-12)
    np.testing.assert_allclose(adv("grpo", norm_by_std=False), [-1] * 3 + [0] * 3 + [1] * 3, atol=1e-12)
    np.testing.assert_allclose(adv("pooled", norm_by_std=False), [-2, 0, -1, -1, -1, 2, 0, -2, 5], atol=1e-12)


def test_groups_are_independent_and_single_and_constant_groups_give_zero():
    # group 0: s [1, 0] -> mean .5, var .5, std .707107 -> +-0.5/.707107 = +-0.707106
    # group 1: constant 0.9 three times (0.9 is not exact in binary: the mean has round-off) -> exactly 0
    # group 2: a single call -> 0 (the reference would give its raw reward 5.0)
    rewards = [1.0, 0.0, 0.9, 0.9, 0.9, 5.0]
    ids = {"group_ids": [0, 0, 1, 1, 1, 2], "agent_ids": ["s"] * 6, "episode_ids": [0, 1, 2, 3, 4, 5]}
    h = 0.5 / (math.sqrt(0.5) + EPS)
    for est in ESTIMATORS:
        out = np.asarray(adv(est, rewards, **ids))
        expected_h = 1.0 if est == "rloo" else h  # rloo: 1 - 0 = 1 and 0 - 1 = -1, never std-scaled
        np.testing.assert_allclose(out[:2], [expected_h, -expected_h], rtol=1e-9)
        assert np.all(out[2:] == 0.0), est


def test_drmas_single_call_agent_in_group_gets_zero_while_others_do_not():
    # agent v appears once in the group -> 0; agent s [1, 0, 0] -> mean 1/3, var (4/9+1/9+1/9)/2 = 1/3,
    # std .57735 -> A = (2/3)/.57735 = 1.154701, (-1/3)/.57735 = -0.577350
    rewards = [1.0, 0.0, 0.0, 1.0]
    ids = {"group_ids": [7] * 4, "agent_ids": ["s", "s", "s", "v"], "episode_ids": [0, 1, 2, 0]}
    s = 1 / (math.sqrt(1 / 3) + EPS)
    np.testing.assert_allclose(adv("drmas", rewards, **ids), [2 / 3 * s, -1 / 3 * s, -1 / 3 * s, 0.0], rtol=1e-9)


def test_types_round_trip_and_numpy_torch_parity():
    ref = np.asarray(adv("drmas"))
    t = compute_advantages(torch.tensor(R, dtype=torch.float32), **IDS)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    torch.testing.assert_close(t, torch.tensor(ref, dtype=torch.float32))
    t64 = compute_advantages(
        torch.tensor(R, dtype=torch.float64), group_ids=torch.tensor(G), agent_ids=A, episode_ids=torch.tensor(E)
    )
    assert t64.dtype == torch.float64
    np.testing.assert_allclose(t64.numpy(), ref, rtol=1e-12)
    n32 = compute_advantages(
        np.array(R, dtype=np.float32), group_ids=np.array(G), agent_ids=np.array(A), episode_ids=np.array(E)
    )
    assert isinstance(n32, np.ndarray) and n32.dtype == np.float32
    np.testing.assert_allclose(n32, ref, rtol=1e-6)
    assert isinstance(adv("drmas"), list)


def test_row_order_does_not_matter_and_string_group_ids_work():
    perm = np.random.default_rng(0).permutation(9)
    for est in ESTIMATORS:
        base = np.asarray(adv(est))
        shuffled = compute_advantages(
            np.array(R)[perm],
            group_ids=np.array(["p0"] * 9)[perm],
            agent_ids=np.array(A)[perm],
            episode_ids=np.array(E)[perm],
            estimator=est,
        )
        np.testing.assert_allclose(shuffled, base[perm], rtol=1e-12, atol=1e-15)


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="unknown estimator"):
        adv("ppo")
    with pytest.raises(ValueError, match="lengths differ"):
        compute_advantages(R[:-1], **IDS)
    with pytest.raises(ValueError, match="finite"):
        compute_advantages([float("nan")] + R[1:], **IDS)
    with pytest.raises(ValueError, match="spans several prompt groups"):
        compute_advantages([1.0, 0.0], group_ids=[0, 1], agent_ids=["s", "v"], episode_ids=[3, 3], estimator="grpo")
    assert compute_advantages(np.zeros(0), group_ids=[], agent_ids=[], episode_ids=[]).shape == (0,)


def test_advantage_stats_second_moments_by_hand():
    # drmas: s has four +-1.118034 and two 0 -> sq_mean 4 * 1.25 / 6 = 0.8333; v: -1 0 1 -> 2/3.
    # pooled (global): s deviations -2 0 -1 -1 0 -2 -> squares sum 10, / 6 / var 5 = 1/3;
    # v deviations -1 2 5 -> squares sum 30, / 3 / 5 = 2. The agent whose mean (4) sits far from the
    # group's (2) gets the large second moment: (sigma_v^2 + (mu_v - mu)^2) / sigma^2 with population
    # moments = (6 + 4) / (40/9) = 2.25, times the (n-1)/n = 8/9 of the unbiased std = 2.0.
    stats = advantage_stats(R, **IDS, estimator="drmas")
    assert stats["adv/s/sq_mean"] == pytest.approx(4 * 1.25 / 6, rel=1e-5)
    assert stats["adv/v/sq_mean"] == pytest.approx(2 / 3, rel=1e-5)
    assert stats["adv/s/n"] == 6 and stats["adv/v/n"] == 3
    assert stats["adv/s/mean"] == pytest.approx(0, abs=1e-12)
    assert stats["adv_global/s/sq_mean"] == pytest.approx(1 / 3, rel=1e-5)
    assert stats["adv_global/v/sq_mean"] == pytest.approx(2.0, rel=1e-5)
    assert stats["adv_global/v/mean"] == pytest.approx(2 / math.sqrt(5), rel=1e-5)  # deviations -1 2 5 -> 2
    # gap = (mu_k - mu)^2 / s^2: v (4 - 2)^2 / 5 = 0.8, s (1 - 2)^2 / 5 = 0.2
    assert stats["adv_global/v/gap"] == pytest.approx(0.8) and stats["adv_global/s/gap"] == pytest.approx(0.2)
    grpo = advantage_stats(R, **IDS, estimator="drmas", global_estimator="grpo")
    assert "adv_global/v/gap" not in grpo
    assert grpo["adv_global/v/sq_mean"] == pytest.approx(2 / 3, rel=1e-5)  # -1 0 1 per episode
    m = agent_moments([1.0, -1.0, 3.0], ["a", "a", "b"])
    assert m == {
        "a": {"n": 2.0, "mean": 0.0, "std": 1.0, "sq_mean": 1.0},
        "b": {"n": 1.0, "mean": 3.0, "std": 0.0, "sq_mean": 9.0},
    }


def test_a_new_estimator_is_one_registry_row_that_the_diagnostics_follow(monkeypatch):
    from drmas_train.algorithm.advantages import EstimatorSpec, calls_by, normalize_groups
    from drmas_train.algorithm.group_stats import GroupWarnings, group_stats

    def by_agent(r, g, a, e):  # one baseline per agent across the whole step
        keys, values, sample_of_call = calls_by(agent=True)(r, g, a, e)
        return [k[1:] for k in keys], values, sample_of_call

    row = EstimatorSpec(by_agent, lambda v, k, std: normalize_groups(v, k, norm_by_std=std), "agent over calls", "x")
    monkeypatch.setitem(ESTIMATORS, "per_agent", row)
    ids = {"group_ids": [0, 1, 0, 1], "agent_ids": ["s", "s", "v", "v"], "episode_ids": [0, 1, 0, 1]}
    rewards = [1.0, 0.0, 0.0, 0.0]
    got = compute_advantages(rewards, **ids, estimator="per_agent")
    assert got == pytest.approx([0.7071, -0.7071, 0.0, 0.0], abs=1e-4)  # groups pooled, agents apart
    stats = group_stats(rewards, **ids, estimator="per_agent")
    assert stats["groups/s/size_max"] == 2.0 and stats["groups/v/zero_var_share"] == 1.0
    warned = GroupWarnings(0.5, estimator="per_agent", group_size=2).check({"step": 1, **stats}, ["v"])
    assert "(agent over calls)" in warned[0]
