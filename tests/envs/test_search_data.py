"""Search data: question files, corpora in both formats, known names, the generated world, caching."""

import gzip
import json
from pathlib import Path

import pytest
from search_helpers import PASSAGES, write_toy

import drmas_envs
from drmas_envs import DataError
from drmas_envs.search.data import load_questions, read_questions
from drmas_envs.search.metrics import contains_answer, exact_match, f1_score, normalize_answer
from drmas_envs.search.retrievers import iter_corpus
from drmas_envs.search.world import generate_world

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


def test_squad_normalisation_em_f1():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple, a pear") == "apple pear"
    assert exact_match("the Vistula River.", ["Vistula", "Vistula river"]) == 1.0
    assert exact_match("Vistula", ["Danube"]) == 0.0 and exact_match(None, ["x"]) == 0.0
    assert f1_score("Vistula river", ["the Vistula"]) == pytest.approx(2 * 0.5 * 1 / 1.5)
    assert f1_score("", ["x"]) == 0.0
    assert contains_answer("Born in Warsaw, Poland.", ["warsaw"]) and not contains_answer("Warsawa", ["Warsaw"])


def test_read_questions_and_errors(tmp_path):
    _, questions = write_toy(tmp_path)
    items = read_questions(questions)
    assert [q["id"] for q in items] == ["q1", "q2"] and items[1]["golden_answers"][1] == "the Vistula River"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a?", "golden_answers": ["x"]}\n{"question": "b?"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: missing field"):
        read_questions(bad)
    bad.write_text('{"question": "a?", "golden_answers": []}\n')
    with pytest.raises(DataError, match="golden_answers"):
        read_questions(bad)
    bad.write_text("not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1"):
        read_questions(bad)
    with pytest.raises(ValueError, match="unknown dataset"):
        load_questions("no-such-set")


def test_corpus_formats(tmp_path):
    gz = tmp_path / "c.jsonl.gz"
    with gzip.open(gz, "wt") as fh:
        fh.write(json.dumps({"id": "a", "contents": '"Warsaw"\nWarsaw lies on the Vistula.'}) + "\n\n")
        fh.write(json.dumps({"title": "Ulm", "text": "Ulm is on the Danube."}) + "\n")
    assert list(iter_corpus(gz)) == [
        ("a", "Warsaw", "Warsaw lies on the Vistula."),
        ("1", "Ulm", "Ulm is on the Danube."),
    ]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(PASSAGES[0]) + "\n" + json.dumps({"id": "x", "body": "?"}) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl:2: a passage needs"):
        list(iter_corpus(bad))


def test_contents_corpus_env(tmp_path):
    corpus = tmp_path / "contents.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": p["id"], "contents": f'"{p["title"]}"\n{p["text"]}'}) + "\n" for p in PASSAGES)
    )
    _, questions = write_toy(tmp_path)
    env = drmas_envs.make("search-1agent", dataset=questions, corpus=str(corpus), index_dir=str(tmp_path / "ix"))
    env.reset(options={"task_index": 0})
    env.step("<search>Marie Curie</search>")
    assert "Doc 1(Title: Marie Curie) Marie Curie was a physicist" in env.observe("searcher")["user"]


def test_generated_world_answers_live_in_the_corpus():
    world = generate_world()
    text = {title: f"{title} {body}" for _, title, body in world.passages}
    assert len(world.passages) == len(text), "titles are unique"
    kinds = {q["source"] for q in world.questions}
    assert kinds == {"world-single-hop", "world-multi-hop"}
    for q in world.questions:
        support = q["supporting_titles"]
        assert len(support) == (2 if q["source"] == "world-multi-hop" else 1)
        assert contains_answer(text[support[-1]], q["golden_answers"]), q
        if len(support) == 2:  # the hop: the first passage names the second entity, not the answer
            assert support[1] in text[support[0]]
            assert not contains_answer(q["question"], q["golden_answers"])
    train, test = load_questions(None, "train"), load_questions(None, "test")
    assert len(train) + len(test) == len(world.questions) and not {q["id"] for q in train} & {q["id"] for q in test}
    assert generate_world() is world and generate_world(seed=1).questions != world.questions


def test_repeated_make_is_cheap_and_shares_the_retriever(tmp_path, monkeypatch):
    monkeypatch.setenv("DRMAS_CACHE_DIR", str(tmp_path / "cache"))
    corpus, questions = write_toy(tmp_path)
    first = drmas_envs.make("search-3agent", dataset=questions, corpus=corpus)
    index_dirs = list((tmp_path / "cache" / "indexes").iterdir())
    assert len(index_dirs) == 1 and (index_dirs[0] / "meta.json").is_file()
    mtime = (index_dirs[0] / "meta.json").stat().st_mtime_ns
    for _ in range(50):
        env = drmas_envs.make("search-3agent", dataset=questions, corpus=corpus)
        assert env.unwrapped._factory.kwargs["retriever"] is first.unwrapped._factory.kwargs["retriever"]
        assert env.tasks[0] is first.tasks[0]
    assert (index_dirs[0] / "meta.json").stat().st_mtime_ns == mtime


@pytest.mark.skipif(not (SHARED / "search").is_dir(), reason="../shared/data is not available")
@pytest.mark.parametrize("name,n", [("nq", 3610), ("hotpotqa", 7405), ("triviaqa", 11313)])
def test_known_names_from_local_data(name, n):
    items = load_questions(name, None, str(SHARED))
    assert len(items) == n and all(q["golden_answers"] for q in items) and items[0]["source"] == name


@pytest.mark.skipif(not (SHARED / "corpus").is_dir(), reason="../shared/data is not available")
def test_real_corpus_env_finds_gold_passage(tmp_path, monkeypatch):
    monkeypatch.setenv("DRMAS_CACHE_DIR", str(tmp_path))
    questions = tmp_path / "q.jsonl"
    questions.write_text(
        json.dumps({"question": "Scott Derrickson nationality", "golden_answers": ["American"]}) + "\n"
    )
    env = drmas_envs.make("search-1agent", dataset=str(questions), data_dir=str(SHARED))
    env.reset()
    env.step("<search>Scott Derrickson</search>")
    assert "Title: Scott Derrickson" in env.observe("searcher")["user"]


def test_world_needs_two_hops():
    """One search with the question finds single-hop answers; two-hop answers need the second hop."""
    from drmas_envs.search.env import _world_retriever

    retriever = _world_retriever("bm25", "minilm")
    found: dict[str, list[bool]] = {"world-single-hop": [], "world-multi-hop": []}
    for q in load_questions(None, "test"):
        hits = retriever.search([q["question"]], 3)[0]
        found[q["source"]].append(any(contains_answer(f"{p.title} {p.text}", q["golden_answers"]) for p in hits))
    single, multi = (sum(v) / len(v) for v in found.values())
    assert single == 1.0 and multi < 0.1, (single, multi)
