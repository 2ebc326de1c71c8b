"""The held-out search worlds (`world="held-out"`): names, wordings, distractors, two-hop questions, the env option."""

import re

import pytest
from search_helpers import play

import drmas_envs
from drmas_envs.search import wordings as W
from drmas_envs.search.env import heldout_retriever
from drmas_envs.search.heldout import (
    FACT_TYPE,
    PASSAGES,
    RELATION,
    SOURCES,
    heldout_questions,
    heldout_world,
    part_role,
    world_keys,
)
from drmas_envs.search.metrics import contains_answer

TRAIN = [heldout_world(k) for k in world_keys("train", 4)]
HELD = {k: heldout_world(k) for k in ("validation-0", "test-0")}
FIXED_WORDS = {"Upper", "Lower", "New", "Old", "Port", "Works"}


def _parts(world) -> set[str]:
    return {
        p for kind in ("city", "person", "company", "country", "river") for n in world.entities[kind] for p in n.split()
    }


def _chunk(template: str) -> str:
    """The longest literal stretch of a template: what shows that the template was used."""
    return max(re.split(r"\{\w+\}", template), key=len).strip(" .,?")


def test_no_held_out_name_or_name_part_occurs_in_a_training_world():
    train_words = {w for t in TRAIN for _, title, x in t.passages for w in re.findall(r"\w+", f"{title} {x}")}
    train_words |= {w for t in TRAIN for q in t.questions for w in re.findall(r"\w+", q["question"])}
    train_parts = set().union(*map(_parts, TRAIN)) - FIXED_WORDS
    for key, world in HELD.items():
        parts = _parts(world) - FIXED_WORDS
        assert len(parts) > 100 and not parts & train_parts, key
        assert not parts & train_words, key  # not as a word of any training passage or question either
        assert {part_role(p) for p in parts} == {1 if key.startswith("validation") else 2}
    assert not (_parts(HELD["validation-0"]) - FIXED_WORDS) & _parts(HELD["test-0"])


def test_facts_have_five_training_wordings_and_held_out_ones_only_held_out_worlds_use():
    train_text = " ".join(x for w in TRAIN for _, _, x in w.passages)
    test_text = " ".join(x for _, _, x in HELD["test-0"].passages)
    other = [t for fact, (train, _) in W.FACTS.items() for t in train] + [t for p in W.DISTRACTORS.values() for t in p]
    for fact, (train, held) in W.FACTS.items():
        assert len(train) >= 5 and held, fact
        used = [t for t in train if _chunk(t) in train_text]
        assert len(used) == len(train), (fact, set(train) - set(used))
        for template in held:
            chunk = _chunk(template)
            assert not any(chunk in t for t in other), chunk  # the chunk shows this template and no other
            assert chunk in test_text and chunk not in train_text, chunk


def test_questions_have_five_phrasings_and_held_out_ones_for_the_held_out_worlds():
    def frame(q):
        return q["question"].replace(q["entity"], "{e}")

    seen: dict[str, set[str]] = {}
    for w in TRAIN:
        for q in w.questions:
            if q["hops"] == 1:
                seen.setdefault(q["relation"], set()).add(frame(q))
    for relation, (train, held) in W.FRAMES.items():
        assert len(train) >= 5 and held
        assert seen[relation] == {f[0].upper() + f[1:] for f in train}, relation
    reworded = [q for q in HELD["test-0"].questions if q["source"] == "world-reworded-question"]
    held_frames = {f[0].upper() + f[1:] for _, held in W.FRAMES.values() for f in held}
    assert reworded and all(frame(q) in held_frames for q in reworded)
    assert {q["source"] for q in HELD["test-0"].questions} == set(SOURCES) - {"world-single-hop"}


def _typed(world, text: str, answer_type: str) -> set[str]:
    if answer_type == "year":
        return set(re.findall(r"\b\d{4}\b", text))
    found = {n: len(re.findall(rf"\b{re.escape(n)}\b", text, re.I)) for n in world.entities[answer_type]}
    inside = {n for n in found for m in found if n != m and n in m and found[n] == found[m]}  # "X" of "Upper X"
    return {n for n, count in found.items() if count and n not in inside}


@pytest.mark.parametrize("key", ["train-0", "test-0"])
def test_the_answer_type_alone_never_picks_the_answer_out_of_its_passage(key):
    world = heldout_world(key)
    text = {t: x for _, t, x in world.passages}
    types = {rel: FACT_TYPE[f] for f, rel in RELATION.items()}
    for q in world.questions:
        if q["hops"] == 1:
            passage, answer = text[q["supporting_titles"][0]], q["golden_answers"][0]
            others = _typed(world, passage, types[q["relation"]]) - {answer, q["entity"]}
            assert contains_answer(passage, [answer]) and others, q


@pytest.mark.parametrize("key", ["train-0", "test-0"])
def test_no_question_holds_its_answer(key):
    questions = heldout_world(key).questions
    assert not [q for q in questions if contains_answer(q["question"], q["golden_answers"])]


def test_two_hop_questions_never_name_the_middle_entity_and_need_its_search():
    world = HELD["test-0"]
    text = {t: x for _, t, x in world.passages}
    retriever = heldout_retriever("test-0", "bm25", "minilm")
    two = [q for q in world.questions if q["hops"] == 2]
    found = 0
    for q in two:
        first, second = q["supporting_titles"]
        assert q["entity"] in q["question"] and q["bridge"] in text[first], q  # the first passage names it
        assert not set(q["bridge"].split()) - FIXED_WORDS & set(re.findall(r"\w+", q["question"])), q
        assert contains_answer(text[second], q["golden_answers"]), q
        hits = retriever.search([q["question"]], 3)[0]
        found += any(contains_answer(f"{p.title} {p.text}", q["golden_answers"]) for p in hits)
    assert len(two) == 420 and found / len(two) < 0.1, found / len(two)


def test_confusable_names_and_two_passages_per_entity():
    world = HELD["test-0"]
    people = world.entities["person"]
    given = [n.split()[0] for n in people]
    assert len(set(given)) < len(people) and len({n.split()[1] for n in people}) < len(people)
    cities = world.entities["city"]
    assert any(a != b and a in b.split() for a in cities for b in cities)  # "Upper X" beside "X"
    titles = [t for _, t, _ in world.passages]
    per_kind = {kind: len(p) for kind, p in PASSAGES.items()}
    assert len(titles) == len(set(titles)) == sum(len(world.entities[k]) * n for k, n in per_kind.items())


def test_worlds_are_pure_functions_of_their_key():
    again = heldout_world.__wrapped__("test-0")
    assert again.passages == HELD["test-0"].passages and again.questions == HELD["test-0"].questions
    assert heldout_world("train-1").passages != TRAIN[0].passages
    with pytest.raises(ValueError, match="role"):
        heldout_world("dev-0")


def test_the_env_option_plays_a_two_hop_question_in_its_own_world():
    env = drmas_envs.make("search-2agent", world="held-out", split="test", hops=[2], max_steps=3)
    assert {q["world"] for q in env.tasks} == {"test-0"} and len(env.tasks) == 420
    q = env.tasks[0]
    env.reset(options={"task_index": 0})
    env.step(f"<search>{q['entity']}</search>")
    assert q["bridge"] in env.observe("search")["user"]  # the first search finds the middle entity
    env.step(f"<search>{q['bridge']}</search>")
    assert f"Title: {q['supporting_titles'][1]})" in env.observe("answer")["user"]
    rewards, info = play(env, [("answer", f"<answer>{q['golden_answers'][0]}</answer>")])
    assert set(rewards.values()) == {1.0} and info["source"] == "world-two-hop"


def test_retrieval_reward_pays_each_search_call_for_the_supporting_passages_it_finds_first():
    env = drmas_envs.make("search-2agent", world="held-out", split="test", hops=[2], max_steps=4, retrieval_reward=0.25)
    q = env.tasks[0]
    env.reset(options={"task_index": 0})
    for query in (q["entity"], q["entity"], q["bridge"]):  # the repeated search finds nothing new
        env.step(f"<search>{query}</search>")
    rewards, info = play(env, [("answer", "<answer>wrong</answer>")])
    assert [(c["agent"], c["bonus"], c["reward"]) for c in info["calls"]] == [
        ("search", 0.25, 0.25),
        ("search", 0.0, 0.0),
        ("search", 0.25, 0.25),
        ("answer", 0.0, 0.0),
    ]
    assert rewards == {"search": 0.5, "answer": 0.0} and info["correct"] is False and info["team_reward"] == 0.0
    plain = drmas_envs.make("search-2agent", world="held-out", split="test", hops=[2], max_steps=4)
    plain.reset(options={"task_index": 0})
    plain.step(f"<search>{q['entity']}</search>")
    assert play(
        plain,
        [("search", "<search>x</search>"), ("search", "<search>y</search>"), ("answer", "<answer>wrong</answer>")],
    )[0] == {
        "search": 0.0,
        "answer": 0.0,
    }
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="retrieval_reward"):
            drmas_envs.make("search-2agent", world="held-out", retrieval_reward=bad)


def test_splits_and_clear_errors():
    assert len(heldout_questions("train", 2)) == 1800
    train = drmas_envs.make("search-1agent", world="held-out", train_worlds=2)
    assert {q["world"] for q in train.tasks} == {"train-0", "train-1"}
    val = drmas_envs.make("search-1agent", world="held-out", split="validation", hops=[1])
    assert {q["source"] for q in val.tasks} == {"world-template", "world-reworded-question", "world-reworded-passage"}
    with pytest.raises(ValueError, match="held-out' has a validation split"):
        drmas_envs.make("search-1agent", split="validation")
    with pytest.raises(ValueError, match="leave dataset and corpus unset"):
        drmas_envs.make("search-1agent", world="held-out", dataset="q.jsonl")
    with pytest.raises(ValueError, match="world must be"):
        drmas_envs.make("search-1agent", world="other")
    with pytest.raises(ValueError, match="train_worlds"):
        drmas_envs.make("search-1agent", world="held-out", train_worlds=0)
