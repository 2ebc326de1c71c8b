"""`algo.balance_strata`: every stratum of an agent carries the same total weight in a step.

The motivating case, by hand: a Verifier paid 1 for a right verdict, which approves half of the
attempts it sees whatever their grade (it cannot tell them apart). Three prompt groups of four
episodes, one review each:

    g0, g1: four wrong attempts; verdicts approve, reject, reject, approve -> rewards 0 1 1 0
    g2:     four right attempts; verdicts approve, reject, reject, approve -> rewards 1 0 0 1

Dr. MAS per (group, agent): every group's rewards are 0/1 twice each, mean 1/2, unbiased std
sqrt(1/3) -> A = +-(1/2)/sqrt(1/3) = +-sqrt(3)/2 ~ 0.866. The push toward "approve" (the sum of
the advantages of the approving calls minus that of the rejecting ones) is -4c in g0 and g1 and +4c
in g2 (c = sqrt(3)/2): -4c in all, toward "reject", from the base rate alone (8 wrong attempts, 4
right). Balanced, the 8 wrong-attempt calls weigh 4/8 = 1/2 and the 4 right-attempt calls 1: the
push is -2c - 2c + 4c = 0.
"""

import numpy as np
import pytest

from drmas_train.algorithm.advantages import compute_advantages, strata_weights
from drmas_train.algorithm.records import CallRecord
from drmas_train.config import build_config
from drmas_train.rollout import RolloutBatch
from drmas_train.run.trainer import Trainer

VERDICTS = ["approve", "reject", "reject", "approve"] * 3
STRATA = ["wrong"] * 8 + ["right"] * 4
REWARDS = [float((v == "approve") == (s == "right")) for v, s in zip(VERDICTS, STRATA)]
GROUPS = [e // 4 for e in range(12)]
C = np.sqrt(3) / 2


def push_toward_approve(advantages):
    sign = np.array([1.0 if v == "approve" else -1.0 for v in VERDICTS])
    return float(np.sum(sign * np.asarray(advantages)))


def test_weights_by_hand_the_rarest_stratum_keeps_one_and_others_shrink_to_its_total():
    agents = ["v"] * 12 + ["s", "s", "v"]
    strata = STRATA + [None, "x", None]
    w = strata_weights(agents, strata)
    assert w.tolist() == [0.5] * 8 + [1.0] * 4 + [1.0, 1.0, 1.0]  # s: one stratum only; None: unlabelled
    assert strata_weights(["v", "v", "v"], ["a", "b", "b"]).tolist() == [1.0, 0.5, 0.5]
    assert strata_weights(["v", "w"], [None, None]).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="lengths differ"):
        strata_weights(["v"], ["a", "b"])


def test_balancing_cancels_the_base_rate_push_on_a_verifier_that_cannot_tell_attempts_apart():
    ids = dict(group_ids=GROUPS, agent_ids=["verifier"] * 12, episode_ids=list(range(12)))
    adv = compute_advantages(np.array(REWARDS), **ids, estimator="drmas")
    assert np.abs(adv) == pytest.approx([C] * 12, rel=1e-5)
    assert push_toward_approve(adv) == pytest.approx(-4 * C, rel=1e-5)  # toward "reject"
    balanced = adv * strata_weights(ids["agent_ids"], STRATA)
    assert push_toward_approve(balanced) == pytest.approx(0.0, abs=1e-9)
    # A Verifier that does tell them apart keeps a push toward the right verdict in each stratum.
    for i in range(12):
        assert np.sign(balanced[i]) == (1.0 if REWARDS[i] == 1.0 else -1.0)


def _record(e, agent, reward, stratum):
    return CallRecord(e // 4, e, agent, "shared", 0, [1], [2], [0.0], reward=reward, stratum=stratum)


@pytest.mark.parametrize("balance", [False, True])
def test_the_trainer_scales_advantages_by_the_strata_weights_when_asked(tmp_path, balance):
    overrides = {"log.run_dir": str(tmp_path / "run"), "algo.balance_strata": balance, "eval.before_train": False}
    trainer = Trainer(build_config("smoke", overrides))
    solver = [_record(e, "solver", float(e % 2), None) for e in range(12)]
    verifier = [_record(e, "verifier", r, s) for e, (r, s) in enumerate(zip(REWARDS, STRATA))]
    batch = RolloutBatch(records=solver + verifier, episodes=[], group_of=GROUPS, task_of=GROUPS)
    row = trainer._advantages(batch)
    got = np.array([r.advantage for r in verifier])
    assert push_toward_approve(got) == pytest.approx(0.0 if balance else -4 * C, abs=1e-5)
    solver_adv = [r.advantage for r in solver]
    assert np.abs(solver_adv) == pytest.approx([np.sqrt(3) / 2] * 12, rel=1e-5)  # unlabelled: unchanged
    if balance:
        assert row["balance/verifier/wrong"] == 0.5 and row["balance/verifier/right"] == 1.0
    else:
        assert not any(k.startswith("balance/") for k in row)
