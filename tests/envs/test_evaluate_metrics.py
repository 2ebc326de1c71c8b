"""The project's one set of evaluation metrics (`drmas_envs.evaluate`) and the flags both eval CLIs share."""

import math

import pytest
from test_math_env import oracle_and_wrong_policies

import drmas_envs
from drmas_envs import EpisodeResult
from drmas_envs.cli import build_parser
from drmas_envs.evaluate import pass_at_k, result_table, summarise, tally


def test_unbiased_pass_at_k_by_hand():
    # 5 episodes, 2 right, k = 2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 0, 2) == 0.0 and pass_at_k(5, 4, 2) == 1.0  # 4 right of 5: any 2 hold one
    assert pass_at_k(4, 1, 4) == 1.0 and pass_at_k(4, 0, 4) == 0.0  # n = k: whether any is right
    assert pass_at_k(16, 1, 1) == pytest.approx(1 / 16)  # pass@1 is the share of right episodes
    assert pass_at_k(200, 3, 16) == pytest.approx(1 - math.prod((197 - i) / (200 - i) for i in range(16)))
    for bad in [(3, 1, 4), (3, 4, 2), (3, 1, 0)]:
        with pytest.raises(ValueError, match="pass@k needs"):
            pass_at_k(*bad)


def test_summarise_per_source_with_more_samples_than_k():
    correct = {"a": [True, True, False, False, False], "b": [False] * 5, "c": [True] * 5}
    sources = {"a": "s1", "b": "s1", "c": "s2"}
    res = summarise(correct, sources, 2)
    assert res["avg@2"] == pytest.approx((0.4 + 0 + 1) / 3)
    assert res["pass@2"] == pytest.approx((0.7 + 0 + 1) / 3)
    assert res["n_problems"] == 3
    assert res["by_source"]["s1"] == {"avg@2": pytest.approx(0.2), "pass@2": pytest.approx(0.35), "n_problems": 2}
    assert res["by_source"]["s2"] == {"avg@2": 1.0, "pass@2": 1.0, "n_problems": 1}
    table = result_table(res, 2).splitlines()
    assert table[0].split() == ["source", "problems", "avg@2", "pass@2"] and table[2].split()[0] == "s1"


def test_tally_groups_episodes_by_problem_and_needs_an_outcome():
    results = [EpisodeResult(infos={"x": {"correct": c, "source": "s"}}) for c in (True, False, False)]
    correct, sources = tally(results, [7, 7, 3], "env")
    assert correct == {7: [True, False], 3: [False]} and sources == {7: "s", 3: "s"}
    with pytest.raises(ValueError, match="reports no outcome"):
        tally([EpisodeResult(infos={"x": {}})], [0], "env")


def test_evaluate_draws_more_samples_than_k():
    # right on the first 2 of every 5 episodes of a problem: avg@2 = 0.4, pass@2 = 0.7 (not 1.0: 5 > k)
    kw = {"level": 1, "n_per_level": 10}
    oracle, _ = oracle_and_wrong_policies(drmas_envs.make("math-1agent", **kw).unwrapped.tasks)
    seen: dict[str, int] = {}

    def two_right(agent, observations):
        out = []
        for o, good in zip(observations, oracle(agent, observations)):
            n = seen[o["user"]] = seen.get(o["user"], 0) + 1
            out.append(good if n <= 2 else "\\boxed{-7}")
        return out

    res = drmas_envs.evaluate(two_right, "math-1agent", k=2, samples=5, n_problems=3, batch_episodes=4, **kw)
    assert res["avg@2"] == pytest.approx(0.4) and res["pass@2"] == pytest.approx(0.7) and res["n_problems"] == 3
    with pytest.raises(ValueError, match="samples at least k"):
        drmas_envs.evaluate(two_right, "math-1agent", k=2, samples=1, **kw)


def test_max_tokens_is_a_deprecated_alias(capsys):
    args = build_parser().parse_args(["eval", "--env", "e", "--model", "m", "--max-tokens", "12"])
    assert args.max_new_tokens == 12
    assert "--max-tokens is deprecated; use --max-new-tokens" in capsys.readouterr().err
    assert "--max-tokens" not in build_parser()._subparsers._group_actions[0].choices["eval"].format_help()
