"""The worked example of docs/workflows.md: a two-agent debate written on the workflow base."""

import inspect

import pytest
from pettingzoo.test import api_test

from drmas_envs import WorkflowEnv, run_lockstep
from drmas_envs.examples import debate
from drmas_envs.examples.debate import Debate, debate_env

TASK = {"problem": "What is $4 + 4$?", "answer": "8", "source": "unit"}


def play(lines, workflow=Debate):
    env = WorkflowEnv(workflow, [TASK], format_penalty=0.1)
    env.reset(options={"task": TASK})
    said = {r: list(v) for r, v in lines.items()}
    order = []

    def act(agent, idx, obs):
        order.append(agent)
        return [said[agent].pop(0)]

    (res,) = run_lockstep([env], act)
    return res, order


def test_api_test():
    api_test(debate_env(), num_cycles=30)


def test_agreement_ends_the_debate_with_the_team_reward():
    res, order = play({"proposer": ["\\boxed{8}"], "critic": ["Agreed: \\boxed{\\frac{16}{2}}"]})
    assert order == ["proposer", "critic"] and res.rewards == {"proposer": 1.0, "critic": 1.0}


def test_disagreement_runs_all_rounds_and_the_last_answer_counts():
    res, order = play({"proposer": ["\\boxed{9}", "\\boxed{7}"], "critic": ["\\boxed{8}", "no box"]})
    assert order == ["proposer", "critic", "proposer", "critic"]
    assert res.rewards == {"proposer": 0.0, "critic": pytest.approx(-0.1)}  # last call malformed: no answer


def test_more_rounds_by_subclassing():
    class LongDebate(Debate):
        rounds = 3
        max_calls = 6

    res, order = play(
        {"proposer": ["\\boxed{1}", "\\boxed{2}", "\\boxed{8}"], "critic": ["\\boxed{3}"] * 3}, LongDebate
    )
    assert len(order) == 6 and res.info["answer"] == "3" and res.rewards["proposer"] == 0.0


def test_example_is_about_a_hundred_lines():
    code = [ln for ln in inspect.getsource(debate).splitlines() if ln.strip()]
    assert len(code) <= 110
