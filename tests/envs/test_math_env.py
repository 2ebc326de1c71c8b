"""math-1agent / math-2agent: scripted episodes with exact rewards, turn order, options, evaluate."""

import math

import pytest

import drmas_envs
from drmas_envs import PromptTemplate, run_lockstep

TASK = {"id": "t0", "problem": "What is $2 + 3$?", "answer": "5", "source": "unit"}
RIGHT, WRONG = "2 + 3 = 5, so \\boxed{5}", "I think \\boxed{6}"
APPROVE, REJECT = "Looks right. <verify>approve</verify>", "Wrong. <verify>reject</verify>"


def play(env_id, script, task=TASK, **kw):
    """Run one episode where each agent says its scripted lines in order; return (result, agents in order)."""
    env = drmas_envs.make(env_id, **kw)
    env.reset(options={"task": task})
    lines = {a: list(v) for a, v in script.items()}
    order = []

    def act(agent, idx, obs):
        order.append(agent)
        assert obs[0]["role"] == agent
        return [lines[agent].pop(0)]

    (res,) = run_lockstep([env], act)
    return res, order


def test_right_answer_then_approve_gives_every_agent_one():
    res, order = play("math-2agent", {"solver": [RIGHT], "verifier": [APPROVE]})
    assert order == ["solver", "verifier"]
    assert res.rewards == {"solver": 1.0, "verifier": 1.0}
    assert res.info["correct"] is True and res.info["answer"] == "5" and res.info["reference"] == "5"
    assert res.info["calls_per_agent"] == {"solver": 1, "verifier": 1}


def test_wrong_answer_gives_zero():
    res, _ = play("math-2agent", {"solver": [WRONG], "verifier": [APPROVE]})
    assert res.rewards == {"solver": 0.0, "verifier": 0.0}
    assert res.info["correct"] is False and res.info["answer"] == "6"


def test_reject_brings_a_second_solver_turn_and_last_answer_counts():
    res, order = play("math-2agent", {"solver": [WRONG, RIGHT], "verifier": [REJECT]})
    assert order == ["solver", "verifier", "solver"]
    assert res.rewards == {"solver": 1.0, "verifier": 1.0}
    res, _ = play("math-2agent", {"solver": [RIGHT, WRONG], "verifier": [REJECT]})
    assert res.rewards == {"solver": 0.0, "verifier": 0.0} and res.info["answer"] == "6"


@pytest.mark.parametrize("max_loops", [1, 2, 3, 5])
def test_never_exceeds_max_loops(max_loops):
    res, order = play("math-2agent", {"solver": [WRONG] * 9, "verifier": [REJECT] * 9}, max_loops=max_loops)
    assert order.count("solver") == max_loops and order.count("verifier") == max_loops - 1
    assert order == (["solver", "verifier"] * max_loops)[:-1]
    assert res.info["truncated"] is False


def test_malformed_verdict_counts_as_approve_by_default_and_is_penalised():
    res, order = play("math-2agent", {"solver": [RIGHT], "verifier": ["seems fine to me"]})
    assert order == ["solver", "verifier"]
    assert res.rewards == {"solver": 1.0, "verifier": pytest.approx(0.9)}
    assert res.info["malformed_per_agent"] == {"solver": 0, "verifier": 1}
    assert [c["valid"] for c in res.info["calls"]] == [True, False]


def test_missing_verdict_reject_asks_for_another_attempt():
    script = {"solver": [WRONG, RIGHT], "verifier": ["<verify>maybe</verify>"]}
    res, order = play("math-2agent", script, missing_verdict="reject")
    assert order == ["solver", "verifier", "solver"]
    assert res.rewards == {"solver": 1.0, "verifier": pytest.approx(0.9)}
    assert res.info["verdicts"] == ["reject"]


@pytest.mark.parametrize(
    "solver, verifier, bonus",
    [
        ([RIGHT], [APPROVE], 0.5),  # approves a right attempt
        ([WRONG, RIGHT], [REJECT], 0.5),  # rejects a wrong attempt; the retry does not matter
        ([WRONG, WRONG], [REJECT], 0.5),
        ([WRONG], [APPROVE], 0.0),  # approves a wrong attempt
        ([RIGHT, RIGHT], [REJECT], 0.0),  # rejects a right attempt although the retry is right too
        ([RIGHT], ["seems fine"], 0.0),  # malformed: counts as approve, earns nothing
    ],
)
def test_verdict_reward_pays_the_verifier_for_a_right_verdict_only(solver, verifier, bonus):
    res, _ = play("math-2agent", {"solver": solver, "verifier": verifier}, verdict_reward=0.5)
    team = float(res.info["correct"])
    penalty = 0.1 * res.info["malformed_per_agent"]["verifier"]
    assert res.rewards["solver"] == pytest.approx(team)
    assert res.rewards["verifier"] == pytest.approx(team - penalty + bonus)
    calls = res.info["calls"]
    assert [c["bonus"] for c in calls] == [0.0, bonus] + [0.0] * (len(calls) - 2)
    assert calls[1]["reward"] == pytest.approx(team - penalty + bonus)
    assert res.info["team_reward"] == team  # the team's reward and outcome stay the paper's


def test_verdict_reward_is_off_by_default_and_not_negative():
    res, _ = play("math-2agent", {"solver": [RIGHT], "verifier": [APPROVE]})
    assert [c["bonus"] for c in res.info["calls"]] == [0.0, 0.0]
    with pytest.raises(ValueError, match="verdict_reward"):
        drmas_envs.make("math-2agent", verdict_reward=-1.0)


def test_review_malformed_off_skips_the_verifier_for_an_attempt_without_an_answer():
    res, order = play("math-2agent", {"solver": ["no box", RIGHT], "verifier": []}, review_malformed=False)
    assert order == ["solver", "solver"]
    assert res.info["verdicts"] == [None] and res.info["attempts_correct"] == [False, True]
    assert res.rewards == {"solver": pytest.approx(0.9), "verifier": 1.0}
    # A well-formed attempt is still reviewed, and the verdicts stay aligned with the attempts.
    script = {"solver": ["no box", WRONG, RIGHT], "verifier": [REJECT]}
    res, order = play("math-2agent", script, review_malformed=False, max_loops=3, verdict_reward=1.0)
    assert order == ["solver", "solver", "verifier", "solver"]
    assert res.info["verdicts"] == [None, "reject"] and res.info["attempts_correct"] == [False, False, True]
    assert res.rewards["verifier"] == pytest.approx(2.0)  # team 1 + a right verdict on attempt 2
    # On (the default), the paper's loop: every attempt but the last is reviewed.
    res, order = play("math-2agent", {"solver": ["no box", RIGHT], "verifier": [REJECT]})
    assert order == ["solver", "verifier", "solver"] and res.info["verdicts"] == ["reject"]


def test_each_verifier_call_is_labelled_with_the_grade_of_the_attempt_it_reviewed():
    # A wrong attempt rejected, then a right one approved (3 loops): the Verifier's calls carry the
    # reviewed attempts' grades; Solver calls carry none. The label never changes a reward.
    script = {"solver": [WRONG, RIGHT], "verifier": [REJECT, APPROVE]}
    res, order = play("math-2agent", script, max_loops=3)
    assert order == ["solver", "verifier", "solver", "verifier"]
    assert [c["stratum"] for c in res.info["calls"]] == [None, "wrong", None, "right"]
    assert res.rewards == {"solver": 1.0, "verifier": 1.0}
    # With review_malformed off, a skipped attempt has no review, and the labels stay aligned.
    script = {"solver": ["no box", RIGHT, WRONG], "verifier": [REJECT]}
    res, _ = play("math-2agent", script, review_malformed=False, max_loops=3)
    assert [c["stratum"] for c in res.info["calls"]] == [None, None, "right", None]
    res, _ = play("math-1agent", {"solver": [RIGHT]})
    assert [c["stratum"] for c in res.info["calls"]] == [None]


@pytest.mark.parametrize(
    "solver, verifier, verdict, order",
    [
        ([RIGHT], ["2 + 3 = 5. \\boxed{5}"], "approve", ["solver", "verifier"]),
        ([RIGHT], ["\\boxed{\\frac{10}{2}}"], "approve", ["solver", "verifier"]),  # graded, not string-matched
        ([WRONG, RIGHT], ["\\boxed{5}"], "reject", ["solver", "verifier", "solver"]),
        ([RIGHT, RIGHT], ["\\boxed{4}"], "reject", ["solver", "verifier", "solver"]),  # a wrong check rejects
        (["no box", RIGHT], ["\\boxed{5}"], "reject", ["solver", "verifier", "solver"]),  # nothing to approve
    ],
)
def test_a_recomputing_verifier_approves_iff_its_own_answer_equals_the_attempts(solver, verifier, verdict, order):
    res, got = play(
        "math-2agent", {"solver": solver, "verifier": verifier}, verifier_mode="recompute", verdict_reward=1.0
    )
    assert got == order and res.info["verdicts"] == [verdict]
    right_verdict = (verdict == "approve") == res.info["attempts_correct"][0]
    assert res.rewards["verifier"] == pytest.approx(res.info["team_reward"] + right_verdict)
    assert res.info["calls"][1]["valid"] is True


def test_a_recomputing_verifier_does_not_see_the_attempt_and_without_an_answer_is_malformed():
    env = drmas_envs.make("math-2agent", verifier_mode="recompute")
    env.reset(options={"task": TASK})
    env.step("I think the answer is \\boxed{6}")
    obs = env.observe("verifier")
    assert "What is $2 + 3$?" in obs["user"] and "6" not in obs["user"] + obs["system"].split("Example")[0]
    assert obs["reply_prefix"] == ""
    # No answer in the check: malformed, penalised, and counted as missing_verdict (approve by default).
    res, order = play("math-2agent", {"solver": [RIGHT], "verifier": ["looks fine"]}, verifier_mode="recompute")
    assert order == ["solver", "verifier"] and res.info["verdicts"] == ["approve"]
    assert res.rewards["verifier"] == pytest.approx(0.9) and res.info["malformed_per_agent"]["verifier"] == 1
    with pytest.raises(ValueError, match="verifier_mode"):
        drmas_envs.make("math-2agent", verifier_mode="vote")
    with pytest.raises(ValueError, match="verdict_first"):
        drmas_envs.make("math-2agent", verifier_mode="recompute", verdict_first=True)


def test_conflicting_verdict_tags_are_malformed():
    res, _ = play("math-2agent", {"solver": [RIGHT], "verifier": ["<verify>approve</verify> <verify>reject</verify>"]})
    assert res.info["malformed_per_agent"]["verifier"] == 1


@pytest.mark.parametrize("bad", ["5", "\\boxed{}", "\\boxed{ }", "\\boxed{\\ldots}", "\\boxed{answer}", "\\boxed{5"])
def test_solver_without_an_answer_box_is_malformed_and_wrong(bad):
    res, order = play("math-2agent", {"solver": [bad, bad], "verifier": [REJECT]}, format_penalty=0.25)
    assert order == ["solver", "verifier", "solver"]
    assert res.rewards == {"solver": pytest.approx(-0.5), "verifier": 0.0}
    assert res.info["answer"] is None and res.info["correct"] is False


def test_per_agent_format_penalty():
    script = {"solver": ["no box", RIGHT], "verifier": ["???"]}
    res, _ = play("math-2agent", script, missing_verdict="reject", format_penalty={"solver": 0.5, "verifier": 0.0})
    assert res.rewards == {"solver": 0.5, "verifier": 1.0}


def test_math_1agent_is_one_solver_call():
    res, order = play("math-1agent", {"solver": [RIGHT]})
    assert order == ["solver"] and res.rewards == {"solver": 1.0}
    res, _ = play("math-1agent", {"solver": ["no idea"]})
    assert res.rewards == {"solver": pytest.approx(-0.1)}


def test_observation_holds_problem_and_teammate_outputs_clipped():
    env = drmas_envs.make("math-2agent", max_context_chars=200)
    env.reset(options={"task": TASK})
    first = env.observe("solver")
    assert TASK["problem"] in first["user"] and "\\boxed{}" in first["system"]
    env.step("x" * 100_000 + " \\boxed{6}")
    seen = env.observe("verifier")
    assert TASK["problem"] in seen["user"] and "\\boxed{6}" in seen["user"]
    assert "characters omitted" in seen["user"] and len(seen["user"]) < 1000
    env.step(REJECT)
    again = env.observe("solver")
    assert "<verify>reject</verify>" in again["user"] and "\\boxed{6}" in again["user"]


def test_prompts_can_be_overridden():
    prompts = {"verifier": {"system": "Check it.", "user": "P: {problem} | last: {latest_solution}"}}
    env = drmas_envs.make("math-2agent", prompts=prompts)
    env.reset(options={"task": TASK})
    env.step(RIGHT)
    obs = env.observe("verifier")
    assert obs["system"] == "Check it." and obs["user"] == f"P: {TASK['problem']} | last: {RIGHT}"
    env.reset(options={"task": TASK})
    assert env.observe("solver")["user"].startswith("Problem:")  # untouched role keeps its default
    custom = PromptTemplate("S", "{problem}!")
    env = drmas_envs.make("math-1agent", prompts={"solver": custom})
    env.reset(options={"task": TASK})
    assert env.observe("solver")["user"] == TASK["problem"] + "!"


def test_bad_options_raise_clear_errors():
    with pytest.raises(TypeError, match="no_such_option"):
        drmas_envs.make("math-2agent", no_such_option=1)
    with pytest.raises(ValueError, match="missing_verdict"):
        drmas_envs.make("math-2agent", missing_verdict="maybe")
    with pytest.raises(ValueError, match="max_loops"):
        drmas_envs.make("math-2agent", max_loops=0)
    with pytest.raises(ValueError, match="unknown roles"):
        drmas_envs.make("math-1agent", prompts={"verifier": {"system": "a", "user": "b"}})


def test_pettingzoo_registry_and_render():
    import pettingzoo

    env = pettingzoo.make("aec", "drmas/math-2agent-v0", render_mode="ansi")
    env.reset(seed=1)
    env.step(RIGHT)
    assert "[solver]" in env.render()
    assert env.unwrapped.metadata["name"] == "drmas_math_2agent_v0"


def oracle_and_wrong_policies(tasks):
    answers = {t["problem"]: t["answer"] for t in tasks}

    def oracle(agent, observations):
        if agent == "verifier":
            return [APPROVE] * len(observations)
        return [f"\\boxed{{{answers[o['user'].split(chr(10))[1]]}}}" for o in observations]

    def wrong(agent, observations):
        return [APPROVE if agent == "verifier" else "\\boxed{-1}"] * len(observations)

    return oracle, wrong


def test_evaluate_with_scripted_policies_on_generated_levels():
    kw = {"level": (1, 2), "n_per_level": 20}
    tasks = drmas_envs.make("math-2agent", **kw).unwrapped.tasks
    oracle, wrong = oracle_and_wrong_policies(tasks)
    good = drmas_envs.evaluate(oracle, "math-2agent", k=3, n_problems=12, **kw)
    assert good["avg@3"] == 1.0 and good["pass@3"] == 1.0 and good["n_problems"] == 12
    assert set(good["by_source"]) <= {"generated/L1", "generated/L2"}
    assert sum(s["n_problems"] for s in good["by_source"].values()) == 12
    bad = drmas_envs.evaluate(wrong, "math-1agent", k=2, n_problems=12, **kw)
    assert bad["avg@2"] == 0.0 and bad["pass@2"] == 0.0


def test_evaluate_pass_at_k_semantics():
    # right on the first of every k=4 calls per problem only: avg@4 = 1/4, pass@4 = 1
    kw = {"level": 1, "n_per_level": 10}
    tasks = drmas_envs.make("math-1agent", **kw).unwrapped.tasks
    oracle, _ = oracle_and_wrong_policies(tasks)
    seen = {}

    def first_only(agent, observations):
        outs = []
        for o, good in zip(observations, oracle(agent, observations)):
            n = seen[o["user"]] = seen.get(o["user"], 0) + 1
            outs.append(good if n == 1 else "\\boxed{-7}")
        return outs

    res = drmas_envs.evaluate(first_only, "math-1agent", k=4, n_problems=5, **kw)
    assert math.isclose(res["avg@4"], 0.25) and res["pass@4"] == 1.0
    assert res["by_source"]["generated/L1"]["pass@4"] == 1.0


def test_seeded_order_is_deterministic_and_datasets_are_shared_between_makes():
    def problems(seed, n=5):
        env = drmas_envs.make("math-2agent")
        out = []
        env.reset(seed=seed)
        for _ in range(n):
            out.append(env.observe("solver")["user"])
            env.reset()
        return out

    assert problems(7) == problems(7) and problems(7) != problems(8)
    a, b = drmas_envs.make("math-2agent"), drmas_envs.make("math-1agent")
    assert a.unwrapped.tasks[0] is b.unwrapped.tasks[0]  # generated once, cached


def test_the_episode_rules_reach_the_workflow_as_one_object_and_the_team_owns_the_verifier():
    from drmas_envs.math.workflow import MathRules, MathSolo, MathTeam

    env = drmas_envs.make("math-2agent", max_loops=3, verifier_mode="recompute", max_context_chars=0)
    env.reset(seed=0)
    rules = env.unwrapped.workflow.rules
    assert isinstance(rules, MathRules) and (rules.max_loops, rules.verifier_mode, rules.max_context_chars) == (
        3,
        "recompute",
        0,
    )
    solo = drmas_envs.make("math-1agent", max_loops=3)
    solo.reset(seed=0)
    assert type(solo.unwrapped.workflow) is MathSolo and solo.unwrapped.workflow.rules.max_loops == 1
    assert not any(hasattr(MathSolo, name) for name in ("_reviews", "_verdict_bonus", "_recomputed_verdict"))
    assert all(hasattr(MathTeam, name) for name in ("_reviews", "_verdict_bonus", "_recomputed_verdict"))
