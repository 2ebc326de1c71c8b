"""The env is the one source of rewards: each call's `reward` and `correct` in the final infos.

Episodes are played through the plain PettingZoo loop (`agent_iter()` / `last()`), where an agent
calls several times: a rejected Solver (math-2agent) and several searches (search-3agent). Each
call's reward is the team reward minus its agent's penalty when that call was malformed; the AEC
reward of an agent is the team reward minus the sum of its calls' penalties.
"""

import pytest

import drmas_envs
from drmas_envs import EpisodeResult, Parsed, PromptTemplate, Score, Workflow, WorkflowEnv, evaluate, run_lockstep

TASK = {"id": "t0", "problem": "What is $2 + 3$?", "answer": "5", "source": "unit"}
RIGHT, WRONG, NO_BOX = "2 + 3 = 5, so \\boxed{5}", "I think \\boxed{6}", "five, I think"
APPROVE, REJECT, NO_VERDICT = "<verify>approve</verify>", "Wrong. <verify>reject</verify>", "hmm"


def aec_play(env, lines, **reset):
    """Play one episode with the PettingZoo loop; returns ({agent: last() reward}, {agent: final info})."""
    env.reset(**reset)
    lines = {a: list(v) for a, v in lines.items()}
    rewards, infos = {}, {}
    for agent in env.agent_iter():
        _, reward, terminated, truncated, info = env.last()
        if terminated or truncated:
            rewards[agent], infos[agent] = reward, info
            env.step(None)
        else:
            env.step(lines[agent].pop(0))
    assert not any(lines.values()), f"unused lines {lines}"
    return rewards, infos


def per_call(info, key):
    return [(c["agent"], c[key]) for c in info["calls"]]


def test_rejected_solver_calls_twice_each_call_its_own_reward():
    env = drmas_envs.make("math-2agent", format_penalty={"solver": 0.25, "verifier": 0.5})
    rewards, infos = aec_play(env, {"solver": [NO_BOX, RIGHT], "verifier": [REJECT]}, options={"task": TASK})
    info = infos["solver"]
    assert per_call(info, "reward") == [("solver", 0.75), ("verifier", 1.0), ("solver", 1.0)]
    assert per_call(info, "penalty") == [("solver", 0.25), ("verifier", 0.0), ("solver", 0.0)]
    assert [c["correct"] for c in info["calls"]] == [True, True, True] and info["correct"] is True
    assert rewards == {"solver": 0.75, "verifier": 1.0}
    assert infos["verifier"]["calls"] == info["calls"]  # every agent sees the same call list


def test_wrong_team_every_call_incorrect_penalties_summed_per_agent():
    env = drmas_envs.make("math-2agent", max_loops=3, missing_verdict="reject", format_penalty=0.25)
    script = {"solver": [NO_BOX, WRONG, NO_BOX], "verifier": [NO_VERDICT, REJECT]}
    rewards, infos = aec_play(env, script, options={"task": TASK})
    info = infos["solver"]
    assert per_call(info, "reward") == [
        ("solver", -0.25),
        ("verifier", -0.25),
        ("solver", 0.0),
        ("verifier", 0.0),
        ("solver", -0.25),
    ]
    assert not any(c["correct"] for c in info["calls"]) and info["correct"] is False
    # AEC reward = team reward - the sum of the agent's calls' penalties
    assert rewards == {"solver": -0.5, "verifier": -0.25}
    assert infos["solver"]["format_penalty"] == 0.5 and infos["verifier"]["format_penalty"] == 0.25
    for agent, reward in rewards.items():
        mine = [c for c in info["calls"] if c["agent"] == agent]
        assert reward == pytest.approx(info["team_reward"] - sum(info["team_reward"] - c["reward"] for c in mine))


def test_several_searches_each_call_its_own_reward():
    env = drmas_envs.make("search-3agent", format_penalty=0.125)  # the generated world, BM25
    env.reset(seed=0)
    task = env.unwrapped.workflow.task
    gold = task["golden_answers"][0]
    script = {
        "verifier": ["<verify>no</verify>", "not sure", "<verify>no</verify>"],  # 2nd malformed: counts as no
        "search": ["no tag at all", f"<search>{task['question']}</search>", f"<search>{gold}</search>"],
        "answer": [f"<answer>{gold}</answer>"],  # forced: no searches left
    }
    rewards, infos = aec_play(env, script, options={"task": task})
    info = infos["answer"]
    assert info["team_reward"] == 1.0 and info["correct"] is True and info["forced_answer"] is True
    assert per_call(info, "reward") == [
        ("verifier", 1.0),
        ("search", 0.875),
        ("verifier", 0.875),
        ("search", 1.0),
        ("verifier", 1.0),
        ("search", 1.0),
        ("answer", 1.0),
    ]
    assert all(c["correct"] for c in info["calls"])
    assert rewards == {"verifier": 0.875, "search": 0.875, "answer": 1.0}


# -- the outcome rule: Score.correct, else team reward >= 1 -----------------------------------------------
class Graded(Workflow):
    """One call; the reward is the task's `credit` and the outcome its `right` (None: the default rule)."""

    roles = ("solver",)
    default_prompts = {"solver": PromptTemplate("Answer.", "{q}")}
    max_calls = 1

    def first_role(self):
        return "solver"

    def parse(self, role, text):
        return Parsed(text == "ok", text)

    def transition(self, role, parsed):
        return None

    def context(self, role):
        return {"q": self.task["q"]}

    def score(self):
        return Score(
            self.task["credit"],
            dict(self.task.get("info", {})),
            correct=self.task.get("right"),
            call_bonus=tuple(self.task.get("bonus", ())),
            call_stratum=tuple(self.task.get("stratum", ())),
        )


@pytest.mark.parametrize(
    "task, correct",
    [
        ({"q": "a", "credit": 1.0}, True),  # default rule: reward >= 1
        ({"q": "b", "credit": 0.5}, False),
        ({"q": "c", "credit": 0.5, "right": True}, True),  # graded reward, the workflow says right
        ({"q": "d", "credit": 1.0, "right": False}, False),
    ],
)
def test_outcome_is_score_correct_else_reward_at_least_one(task, correct):
    env = WorkflowEnv(Graded, [task], format_penalty=0.25)
    rewards, infos = aec_play(env, {"solver": ["garbled"]}, options={"task_index": 0})
    assert infos["solver"]["correct"] is correct
    assert infos["solver"]["calls"] == [
        {
            "agent": "solver",
            "valid": False,
            "error": "",
            "penalty": 0.25,
            "bonus": 0.0,
            "reward": task["credit"] - 0.25,
            "correct": correct,
            "stratum": None,
        }
    ]
    assert rewards["solver"] == task["credit"] - 0.25


def test_a_call_bonus_adds_to_its_call_and_agent_but_not_the_outcome():
    env = WorkflowEnv(Graded, [{"q": "a", "credit": 0.0, "bonus": [0.75]}], format_penalty=0.25)
    rewards, infos = aec_play(env, {"solver": ["garbled"]}, options={"task_index": 0})
    assert per_call(infos["solver"], "bonus") == [("solver", 0.75)]
    assert per_call(infos["solver"], "reward") == [("solver", 0.5)]
    assert rewards["solver"] == 0.5 and infos["solver"]["correct"] is False and infos["solver"]["team_reward"] == 0.0


def test_a_call_bonus_of_the_wrong_length_is_an_error():
    env = WorkflowEnv(Graded, [{"q": "a", "credit": 1.0, "bonus": [0.5, 0.5]}])
    env.reset()
    with pytest.raises(ValueError, match="call_bonus has 2 entries for 1 calls"):
        env.step("ok")


def test_a_call_stratum_is_reported_per_call_and_changes_no_reward():
    env = WorkflowEnv(Graded, [{"q": "a", "credit": 1.0, "stratum": ["easy"]}])
    rewards, infos = aec_play(env, {"solver": ["ok"]}, options={"task_index": 0})
    assert per_call(infos["solver"], "stratum") == [("solver", "easy")]
    assert rewards["solver"] == 1.0 and per_call(infos["solver"], "reward") == [("solver", 1.0)]
    env = WorkflowEnv(Graded, [{"q": "a", "credit": 1.0, "stratum": ["x", "y"]}])
    env.reset()
    with pytest.raises(ValueError, match="call_stratum has 2 entries for 1 calls"):
        env.step("ok")


def test_a_score_contradicting_its_own_info_is_an_error():
    env = WorkflowEnv(Graded, [{"q": "x", "credit": 0.0, "info": {"correct": True}}])
    env.reset()
    with pytest.raises(ValueError, match="Score\\(correct=...\\)"):
        env.step("ok")


def test_evaluate_counts_the_envs_outcome_not_a_reward_threshold():
    # Partial credit that the workflow calls right, and full reward that it calls wrong: a reward
    # threshold would count 1 of 3 problems right, the env's outcome counts 2. The env is reached
    # by a `module:Workflow` reference, its tasks passed through evaluate's env kwargs.
    tasks = [
        {"q": "x", "credit": 0.5, "right": True},
        {"q": "y", "credit": 1.0, "right": False},
        {"q": "z", "credit": 0.5, "right": True},
    ]
    result = evaluate(lambda agent, obs: ["ok"] * len(obs), f"{__name__}:Graded", k=2, tasks=tasks)
    assert result["n_problems"] == 3
    assert result["avg@2"] == pytest.approx(2 / 3) and result["pass@2"] == pytest.approx(2 / 3)


def test_run_lockstep_sees_the_same_per_call_rewards_as_the_aec_loop():
    script = {"solver": [WRONG, RIGHT], "verifier": [NO_VERDICT]}
    _, infos = aec_play(drmas_envs.make("math-2agent", missing_verdict="reject"), script, options={"task": TASK})
    env = drmas_envs.make("math-2agent", missing_verdict="reject")
    env.reset(options={"task": TASK})
    lines = {a: list(v) for a, v in script.items()}
    (res,) = run_lockstep([env], lambda agent, idx, obs: [lines[agent].pop(0)])
    assert isinstance(res, EpisodeResult) and res.info["calls"] == infos["solver"]["calls"]
    assert per_call(res.info, "reward") == [("solver", 1.0), ("verifier", 0.9), ("solver", 1.0)]
