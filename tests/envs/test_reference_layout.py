"""Files as the reference's own preprocessing writes them (`~/data/drmas_{math,search}/{train,test_sampled,
test}.parquet`) load by path with their per-source tags; malformed rows stop a load or are skipped and counted."""

import json

import pytest
from paper_fixtures import needs_pyarrow

import drmas_envs
from drmas_envs.data import DataError
from drmas_envs.search.data import load_questions
from drmas_envs.testing import (
    MATH_SAMPLED_SOURCES,
    MATH_TEST_SOURCES,
    SEARCH_SOURCES,
    write_reference_layout,
)


@needs_pyarrow
def test_the_reference_math_files_load_by_path_with_their_sources(tmp_path):
    files = write_reference_layout(
        tmp_path,
        "math",
        {
            "train": {"dapo_filter": 5},
            "test_sampled": dict.fromkeys(MATH_SAMPLED_SOURCES, 2),
            "test": dict.fromkeys(MATH_TEST_SOURCES, 2),
        },
    )
    train = drmas_envs.env_dataset("math-2agent", dataset=str(files["train"]))
    assert len(train) == 5 and {t["source"] for t in train} == {"dapo_filter"}
    assert train[1]["problem"] == "dapo_filter problem 1: what is 1 + 1?" and train[1]["answer"] == "2"
    sampled = drmas_envs.env_dataset("math-2agent", dataset=str(files["test_sampled"]))
    assert [t["source"] for t in sampled] == [s for s in MATH_SAMPLED_SOURCES for _ in range(2)]
    test = drmas_envs.env_dataset("math-2agent", dataset=str(files["test"]))
    assert {t["source"] for t in test} == set(MATH_TEST_SOURCES) and len(test) == 12
    env = drmas_envs.make("math-2agent", dataset=str(files["test_sampled"]))
    env.reset(seed=0)
    assert env.unwrapped.tasks[0]["answer"] == "1"


@needs_pyarrow
def test_the_reference_search_files_load_by_path_with_their_sources(tmp_path):
    files = write_reference_layout(
        tmp_path, "search", {"train": {"nq": 3, "hotpotqa": 3}, "test": dict.fromkeys(SEARCH_SOURCES, 2)}
    )
    train = load_questions(str(files["train"]))
    assert [q["source"] for q in train] == ["nq"] * 3 + ["hotpotqa"] * 3
    assert train[0]["question"] == "nq question 0?" and train[0]["golden_answers"] == ["nq answer 0"]
    test = load_questions(str(files["test"]))
    assert {q["source"] for q in test} == set(SEARCH_SOURCES) and len(test) == 14


def _bad_math_file(tmp_path):
    good = [{"problem": f"p{i}", "answer": str(i)} for i in range(4)]
    lines = [json.dumps(good[0]), "{not json", json.dumps(good[1]), json.dumps({"problem": "no answer"})]
    lines += [json.dumps(g) for g in good[2:]]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_malformed_row_stops_the_load_by_default_naming_file_and_line(tmp_path):
    path = _bad_math_file(tmp_path)
    with pytest.raises(DataError, match=r"bad\.jsonl:2: not valid JSON"):
        drmas_envs.env_dataset("math-2agent", dataset=str(path))


def test_skipped_rows_are_counted_and_named_in_the_provenance(tmp_path, caplog):
    path = _bad_math_file(tmp_path)
    tasks = drmas_envs.env_dataset("math-2agent", dataset=str(path), bad_rows="skip")
    assert [t["answer"] for t in tasks] == ["0", "1", "2", "3"]
    record = drmas_envs.dataset_provenance(tasks)
    assert record["skipped_rows"] == 2
    assert "bad.jsonl:2" in record["first_skipped"][0] and "bad.jsonl:4" in record["first_skipped"][1]
    assert "skipped 2 malformed row(s)" in caplog.text
    search = tmp_path / "q.jsonl"
    search.write_text('{"question": "q?", "golden_answers": ["a"]}\n{"question": ""}\n')
    questions = load_questions(str(search), bad_rows="skip")
    assert len(questions) == 1 and questions.provenance["skipped_rows"] == 1
    with pytest.raises(DataError, match=r"q\.jsonl:2"):
        load_questions(str(search))


def test_bad_rows_is_a_checked_choice():
    with pytest.raises(ValueError, match="bad_rows"):
        drmas_envs.make("math-2agent", bad_rows="ignore")
    with pytest.raises(ValueError, match="bad_rows"):
        drmas_envs.make("search-2agent", bad_rows="ignore")
