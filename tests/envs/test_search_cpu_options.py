"""The search envs' CPU-default options: the env opening each reply's tag (`open_tags`) and the world's hop filter."""

import pytest
from search_helpers import make, play

import drmas_envs
from drmas_envs.search.world import generate_world


def _prefix(env):
    return env.observe(env.agent_selection)["reply_prefix"]


def test_two_agents_open_tags_parse_the_prefix_and_the_reply(toy):
    env = make("search-2agent", toy, open_tags=True, max_steps=2)
    assert _prefix(env) == "<search>" and "<done>" not in env.observe("search")["user"]
    env.step("Marie Curie</search>")  # the model writes only the query and the closing tag
    assert _prefix(env) == "<answer>" and "Warsaw" in env.observe("answer")["user"]
    rewards, info = play(env, [("answer", "Warsaw</answer>")])
    assert rewards == {"search": 1.0, "answer": 1.0} and info["queries"] == ["Marie Curie"]


def test_without_open_tags_no_reply_is_opened(toy):
    env = make("search-2agent", toy, max_steps=2)
    assert _prefix(env) == "" and "<done>" in env.observe("search")["user"]


def test_three_agents_open_every_role(toy):
    env = make("search-3agent", toy, open_tags=True)
    assert _prefix(env) == "<verify>"
    env.step("no</verify>")
    assert _prefix(env) == "<search>"
    env.step("Marie Curie</search>")
    env.step("yes</verify>")
    assert _prefix(env) == "<answer>"
    rewards, _ = play(env, [("answer", "Warsaw</answer>")])
    assert set(rewards.values()) == {1.0}


def test_one_agent_opens_an_answer_at_its_last_call(toy):
    env = make("search-1agent", toy, open_tags=True, max_steps=2)
    assert _prefix(env) == "<search>"
    env.step("Marie Curie</search>")
    assert _prefix(env) == "<answer>"
    rewards, info = play(env, [("searcher", "Warsaw</answer>")])
    assert rewards == {"searcher": 1.0} and info["n_searches"] == 1


def test_hops_keeps_the_worlds_questions_of_those_hop_counts():
    test_split = [q for q in generate_world().questions if q["split"] == "test"]
    for hops, sources in (([1], {"world-single-hop"}), ([2], {"world-multi-hop"})):
        env = drmas_envs.make("search-2agent", split="test", hops=hops)
        tasks = env.tasks
        assert {q["source"] for q in tasks} == sources
        assert [q["id"] for q in tasks] == [q["id"] for q in test_split if q["source"] in sources]
    both = drmas_envs.make("search-2agent", split="test", hops=[1, 2])
    assert len(both.tasks) == len(test_split)


@pytest.mark.parametrize("bad, match", [([3], "hops must be"), ([], "hops must be")])
def test_bad_hops_are_clear_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        drmas_envs.make("search-2agent", hops=bad)


def test_hops_on_a_question_file_is_a_clear_error(toy):
    with pytest.raises(ValueError, match="no hop counts"):
        drmas_envs.make("search-2agent", hops=[1], **toy)


def test_the_project_prompts_examples_practise_their_rules():
    """A small model copies the worked examples: every example query is the question's entity copied from the
    question (an extra word such as "birthplace" was copied into queries the corpus could not match), and every
    example answer is copied from the passage it was given."""
    import re

    from drmas_envs.search import prompts as P

    for name, template in [("search", P.SEARCH), ("search_or_done", P.SEARCH_OR_DONE), ("searcher", P.SEARCHER)]:
        pairs = re.findall(
            r"Question: ([^\n]*?)(?: History: \(no searches yet\))?\n(?:Query|Reply): <search>(.*?)</search>",
            template.system,
        )
        assert len(pairs) >= 1, name
        for question, query in pairs:
            assert query in question, (name, query, question)
    answers = re.findall(r"<information>(.*?)</information>\n(?:Answer|Reply): <answer>(.*?)</answer>", P.ANSWER.system)
    assert len(answers) == 3 and len({a for _, a in answers}) == 3  # three kinds: a place, a year, a river
    for passage, answer in answers + re.findall(
        r"<information>(.*?)</information>\n(?:Answer|Reply): <answer>(.*?)</answer>", P.SEARCHER.system
    ):
        assert answer in passage
