"""The "chain" prompt layout: two-hop worked examples that practise their rule and copy no world's question."""

import re

import pytest

import drmas_envs
from drmas_envs.search import prompts as P
from drmas_envs.search import wordings as W
from drmas_envs.search.world import generate_world

CHAIN = [P.CHAIN_VERIFIER, P.CHAIN_SEARCH, P.CHAIN_ANSWER, P.CHAIN_SEARCH_OR_DONE, P.CHAIN_SEARCHER]


def _frame_pattern(frame: str) -> re.Pattern:
    return re.compile("^" + re.escape(frame).replace(re.escape("{e}"), ".+") + "$", re.I)


def test_no_example_question_is_phrased_like_a_world_question():
    frames = [f for train, held in W.FRAMES.values() for f in train + held]
    frames += {q["question"].replace(q["supporting_titles"][0], "{e}") for q in generate_world().questions}
    patterns = [_frame_pattern(f) for f in frames]
    asked = {q for t in CHAIN for q in re.findall(r"Question: (.*?) History:", t.system)}
    assert len(asked) == 3
    for question in asked:
        assert not [p.pattern for p in patterns if p.match(question)], question


def test_the_examples_search_the_named_entity_then_the_one_its_passage_names():
    steps = re.findall(
        r"Question: ([^\n]*?) History: ([^\n]*)\n(?:Query|Reply): <search>(.*?)</search>", P.CHAIN_SEARCH.system
    )
    assert len(steps) == 3
    for question, history, query in steps:
        infos = re.findall(r"<information>(.*?)</information>", history)
        assert query in (infos[-1] if infos else question), (question, query)  # a second query is read, not asked
        assert infos or query in question
    assert any(query not in question for question, _, query in steps)  # one example is a second hop
    for question, history, answer in re.findall(
        r"Question: ([^\n]*?) History: ([^\n]*)\nAnswer: <answer>(.*?)</answer>", P.CHAIN_ANSWER.system
    ):
        assert answer in re.findall(r"<information>(.*?)</information>", history)[-1], question


@pytest.mark.parametrize("env_id, role", [("search-1agent", "searcher"), ("search-2agent", "search"),
                                          ("search-3agent", "verifier")])  # fmt: skip
def test_every_team_size_gets_the_chain_prompts(env_id, role):
    env = drmas_envs.make(env_id, world="held-out", prompt_layout="chain", split="test")
    env.reset(options={"task_index": 0})
    assert "Marie Curie's home city is in which country?" in env.observe(role)["system"]
    opened = drmas_envs.make("search-2agent", world="held-out", prompt_layout="chain", open_tags=True)
    opened.reset(options={"task_index": 0})
    assert opened.observe("search")["system"] == P.CHAIN_SEARCH.system  # it always searches: no <done> offered
