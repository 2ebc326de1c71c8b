"""Scripted episodes of search-1agent, -2agent and -3agent over a toy corpus: every route, exact rewards."""

import pytest
from pettingzoo.test import api_test
from search_helpers import make, play

import drmas_envs
from drmas_envs import PromptTemplate


@pytest.mark.parametrize("env_id", ["search-1agent", "search-2agent", "search-3agent"])
def test_api_test(env_id, toy):
    api_test(drmas_envs.make(env_id, **toy), num_cycles=30)


@pytest.mark.parametrize("env_id", ["search-1agent", "search-2agent", "search-3agent"])
def test_api_test_on_generated_world(env_id):
    api_test(drmas_envs.make(env_id), num_cycles=30)


def test_three_agents_search_then_answer(toy):
    env = make("search-3agent", toy)
    assert env.possible_agents == ["verifier", "search", "answer"]
    rewards, info = play(
        env,
        [
            ("verifier", "Not enough yet. <verify>no</verify>"),
            ("search", "<search>Marie Curie birthplace</search>"),
            ("verifier", "<verify>yes</verify>"),
            ("answer", "<answer>warsaw.</answer>"),
        ],
    )
    assert rewards == {"verifier": 1.0, "search": 1.0, "answer": 1.0}
    assert info["em"] == 1.0 and info["f1"] == 1.0 and info["answer"] == "warsaw."
    assert info["n_searches"] == 1 and info["answer_in_passages"] is True
    assert info["golden_answers"] == ["Warsaw"] and info["forced_answer"] is False


def test_information_block_reaches_every_agent(toy):
    env = make("search-3agent", toy)
    env.step("<verify>no</verify>")
    env.step("<search>physicist born in Warsaw</search>")  # matches p1, p2, p4 (BM25 drops zero scores)
    for agent in ("verifier", "search", "answer"):
        user = env.observe(agent)["user"]
        assert "Step 1: <search>physicist born in Warsaw</search>" in user
        assert "<information>Doc 1(Title: Marie Curie) Marie Curie was a physicist" in user
        assert "Doc 2(" in user and "Doc 3(" in user and "Doc 4(" not in user  # topk=3


def test_three_agents_answer_at_once_wrong(toy):
    rewards, info = play(
        make("search-3agent", toy), [("verifier", "<verify>yes</verify>"), ("answer", "<answer>Paris</answer>")]
    )
    assert rewards == {"verifier": 0.0, "search": 0.0, "answer": 0.0}
    assert info["n_searches"] == 0 and info["answer_in_passages"] is False and info["f1"] == 0.0


def test_three_agents_max_steps_forces_answer(toy):
    script = []
    for _ in range(3):  # max_steps=4: three searches, then the Answer agent is forced
        script += [("verifier", "<verify>no</verify>"), ("search", "<search>Paris</search>")]
    rewards, info = play(make("search-3agent", toy), [*script, ("answer", "<answer>Warsaw</answer>")])
    assert rewards == {"verifier": 1.0, "search": 1.0, "answer": 1.0}
    assert info["forced_answer"] is True and info["n_searches"] == 3
    assert info["calls_per_agent"] == {"verifier": 3, "search": 3, "answer": 1}


def test_three_agents_malformed_calls_are_penalised(toy):
    rewards, info = play(
        make("search-3agent", toy),
        [
            ("verifier", "I think we need more"),  # no tag -> counts as "no"
            ("search", "<search>   </search>"),  # empty query -> nothing retrieved
            ("verifier", "<verify>maybe</verify>"),  # unknown verdict -> "no"
            ("search", "<search>Marie Curie born</search>"),
            ("verifier", "<verify>yes</verify>"),
            ("answer", "Warsaw"),  # no <answer> tag: no answer
        ],
    )
    assert rewards == pytest.approx({"verifier": -0.02, "search": -0.01, "answer": -0.01})
    assert info["answer"] is None and info["em"] == 0.0 and info["n_searches"] == 1
    assert info["malformed_per_agent"] == {"verifier": 2, "search": 1, "answer": 1}


def test_three_agents_malformed_verdict_can_mean_yes(toy):
    env = make("search-3agent", toy, malformed_verdict="yes", format_penalty=0.5)
    rewards, _ = play(env, [("verifier", "<verify>"), ("answer", "<answer>Warsaw</answer>")])
    assert rewards == {"verifier": 0.5, "search": 1.0, "answer": 1.0}


def test_two_agents_search_then_done(toy):
    env = make("search-2agent", toy)
    assert env.possible_agents == ["search", "answer"]
    rewards, info = play(
        env,
        [
            ("search", "<search>Marie Curie</search>"),
            ("search", "enough. <done>"),
            ("answer", "<answer>Warsaw</answer>"),
        ],
    )
    assert rewards == {"search": 1.0, "answer": 1.0} and info["n_searches"] == 1


def test_two_agents_done_at_once_and_malformed(toy):
    rewards, info = play(make("search-2agent", toy), [("search", "<done/>"), ("answer", "<answer></answer>")])
    assert rewards == {"search": 0.0, "answer": -0.01} and info["answer"] is None
    rewards, info = play(
        make("search-2agent", toy, max_steps=3),
        [("search", "blah"), ("search", "<search>Ulm</search>"), ("answer", "<answer>Ulm</answer>")],
    )
    assert rewards == {"search": -0.01, "answer": 0.0} and info["forced_answer"] is True


def test_one_agent_routes(toy):
    env = make("search-1agent", toy)
    assert env.possible_agents == ["searcher"]
    rewards, info = play(env, [("searcher", "<search>Marie Curie</search>"), ("searcher", "<answer>Warsaw</answer>")])
    assert rewards == {"searcher": 1.0} and info["n_searches"] == 1
    rewards, info = play(make("search-1agent", toy), [("searcher", "<answer>Warsaw</answer>")])
    assert rewards == {"searcher": 1.0} and info["n_searches"] == 0


def test_one_agent_budget_and_malformed(toy):
    script = [("searcher", "<search>a</search>"), ("searcher", "junk"), ("searcher", "<search>Ulm</search>")]
    # the 4th call must answer: a search there is malformed and ends the episode without an answer
    rewards, info = play(make("search-1agent", toy), [*script, ("searcher", "<search>more</search>")])
    assert rewards == pytest.approx({"searcher": -0.02}) and info["answer"] is None
    assert info["calls_per_agent"] == {"searcher": 4} and info["n_searches"] == 2
    env = make("search-1agent", toy)
    env.step("<search>x</search>")
    env.step("<search>y</search>")
    env.step("<search>z</search>")
    assert "Searches left: 0" in env.observe("searcher")["user"]


def test_first_complete_action_wins(toy):
    rewards, info = play(make("search-1agent", toy), [("searcher", "<answer>Warsaw</answer> <search>ignored</search>")])
    assert rewards == {"searcher": 1.0}


def test_em_against_any_gold_answer(toy):
    env = drmas_envs.make("search-3agent", **toy)
    env.reset(options={"task_index": 1})
    rewards, info = play(env, [("verifier", "<verify>yes</verify>"), ("answer", "<answer>Vistula river</answer>")])
    assert rewards["answer"] == 1.0  # "the Vistula River" normalises to "vistula river"
    assert info["f1"] == 1.0


def test_history_window_and_prompt_override(toy):
    template = PromptTemplate("custom system", "Q={question} | {history} | left={searches_left}")
    env = make("search-3agent", toy, history_steps=1, max_steps=5, prompts={"verifier": template})
    for q in ("Paris", "Ulm"):
        env.step("<verify>no</verify>")
        env.step(f"<search>{q}</search>")
    obs = env.observe("verifier")
    assert obs["system"] == "custom system" and obs["user"].startswith("Q=Where was Marie Curie born?")
    assert "Step 2: <search>Ulm</search>" in obs["user"] and "<search>Paris</search>" not in obs["user"]
    assert obs["user"].endswith("left=2")
    assert "Paris" not in env.observe("answer")["user"].split("Search history:")[1]


def test_bad_options_are_clear_errors(toy):
    with pytest.raises(TypeError, match="unknown search env option"):
        drmas_envs.make("search-3agent", topk_=3)
    with pytest.raises(ValueError, match="malformed_verdict"):
        drmas_envs.make("search-3agent", malformed_verdict="maybe")
    with pytest.raises(ValueError, match="unknown roles"):
        drmas_envs.make("search-2agent", prompts={"verifier": PromptTemplate("s", "u")})
    with pytest.raises(ValueError, match="unknown retriever"):
        drmas_envs.make("search-3agent", retriever="tfidf")


@pytest.mark.parametrize("env_id,first", [("search-3agent", "answer"), ("search-2agent", "answer")])
def test_one_step_budget_goes_straight_to_the_answer(toy, env_id, first):
    rewards, info = play(make(env_id, toy, max_steps=1), [(first, "<answer>Warsaw</answer>")])
    assert set(rewards.values()) == {1.0} and info["forced_answer"] is True and info["n_searches"] == 0


def test_one_step_budget_single_agent_must_answer(toy):
    rewards, info = play(make("search-1agent", toy, max_steps=1), [("searcher", "<search>Marie Curie</search>")])
    assert rewards == {"searcher": -0.01} and info["n_searches"] == 0 and info["answer"] is None
