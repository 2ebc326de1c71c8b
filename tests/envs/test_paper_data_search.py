"""The paper's search data by name: nq_hotpotqa_train, search_test_sampled (30 per source), search_test."""

import hashlib
import json
from collections import Counter
from pathlib import Path

import pytest
from paper_fixtures import SEARCH_SOURCES, needs_pyarrow, search_rows, write_rows
from search_helpers import write_toy

import drmas_envs
from drmas_envs import DataError, DatasetNotFoundError
from drmas_envs.search.data import load_questions

TEST_COUNTS = dict(zip(SEARCH_SOURCES, (31, 40, 33, 35, 30, 38, 32)))
REPO = ("PeterJinGo", "nq_hotpotqa_train")
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
SHARED_TEST = {
    "nq": "nq_test",
    "triviaqa": "triviaqa_test",
    "hotpotqa": "hotpotqa_dev",
    "2wikimultihopqa": "2wikimultihopqa_dev",
}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("DRMAS_DATA_DIR", raising=False)


@pytest.fixture
def paper_dir(tmp_path):
    """The repo as `hf download PeterJinGo/nq_hotpotqa_train --repo-type dataset` writes it (Parquet)."""
    pytest.importorskip("pyarrow", reason="pyarrow (optional: drmas-envs[data]) is not installed")
    root = tmp_path.joinpath(*REPO)
    write_rows(root / "train.parquet", search_rows("train", {"nq": 12, "hotpotqa": 9}))
    test_rows = search_rows("test", TEST_COUNTS)
    del test_rows[40]["golden_answers"]  # a row with only reward_model.ground_truth.target, as verl rows have
    write_rows(root / "test.parquet", test_rows)
    return tmp_path


def test_sampled_takes_the_first_30_of_each_of_the_7_sources(paper_dir):
    items = load_questions("search_test_sampled", None, str(paper_dir))
    assert len(items) == 210 and Counter(q["source"] for q in items) == dict.fromkeys(SEARCH_SOURCES, 30)
    assert [q["question"] for q in items[:31]] == [f"nq question {i}?" for i in range(30)] + ["triviaqa question 0?"]
    assert len({q["id"] for q in items}) == 210  # Search-R1 ids repeat across sources; ours carry the source
    assert items[39]["golden_answers"] == ["triviaqa answer 9"]  # from reward_model.ground_truth.target
    prov = items.provenance
    test_file = paper_dir.joinpath(*REPO) / "test.parquet"
    assert prov["per_source"] == 30 and prov["n"] == 210
    assert prov["files"][0]["sha256"] == hashlib.sha256(test_file.read_bytes()).hexdigest()


def test_full_test_and_train_sets(paper_dir):
    full = load_questions("search_test", None, str(paper_dir))
    assert Counter(q["source"] for q in full) == TEST_COUNTS
    train = load_questions("nq_hotpotqa_train", None, str(paper_dir))
    assert Counter(q["source"] for q in train) == {"nq": 12, "hotpotqa": 9}
    assert train.provenance["dataset"] == "nq_hotpotqa_train" and train.provenance["split"] == "train"


def test_env_on_the_validation_set(paper_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("DRMAS_CACHE_DIR", str(tmp_path / "cache"))
    corpus, _ = write_toy(tmp_path)
    env = drmas_envs.make("search-3agent", dataset="search_test_sampled", data_dir=str(paper_dir), corpus=corpus)
    assert len(env.unwrapped.tasks) == 210
    assert drmas_envs.dataset_provenance(env)["dataset"] == "search_test_sampled"
    env.reset(seed=0)
    assert "question" in env.observe(env.agent_selection)["user"]


def test_jsonl_copy_under_a_flat_name(tmp_path):
    write_rows(tmp_path / "search" / "nq_hotpotqa_train_test.jsonl", search_rows("test", TEST_COUNTS))
    items = load_questions("search_test_sampled", None, str(tmp_path))
    assert Counter(q["source"] for q in items) == dict.fromkeys(SEARCH_SOURCES, 30)
    assert items.provenance["files"][0]["path"].endswith("nq_hotpotqa_train_test.jsonl")


def test_not_found_says_how_to_fetch(tmp_path):
    with pytest.raises(DatasetNotFoundError) as err:
        drmas_envs.env_dataset("search-3agent", dataset="nq_hotpotqa_train", data_dir=str(tmp_path))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("dataset 'nq_hotpotqa_train' not found")
    assert str(tmp_path / "PeterJinGo" / "nq_hotpotqa_train") in msg and "HF_HUB_OFFLINE" in msg
    assert "hf download PeterJinGo/nq_hotpotqa_train --repo-type dataset --local-dir" in msg
    assert "nq_hotpotqa_train_train.parquet" in msg


def test_flashrag_names_in_the_hub_layout(tmp_path):
    root = tmp_path / "RUC-NLPIR" / "FlashRAG_datasets" / "bamboogle"
    write_rows(root / "test.jsonl", [{"id": "test_0", "question": "Who?", "golden_answers": ["Me"]}])
    write_rows(root / "train.jsonl", [{"id": "train_0", "question": "Not this?", "golden_answers": ["x"]}])
    items = load_questions("bamboogle", None, str(tmp_path))
    assert [(q["question"], q["source"]) for q in items] == [("Who?", "bamboogle")]


@needs_pyarrow
def test_malformed_parquet_row_names_file_and_row(tmp_path):
    rows = search_rows("test", {"nq": 3})
    rows[2]["question"] = "  "
    path = write_rows(tmp_path.joinpath(*REPO) / "test.parquet", rows)
    with pytest.raises(DataError, match=rf"{path}: row 3: `question` must be a non-empty string"):
        load_questions("search_test", None, str(tmp_path))


def test_malformed_jsonl_line_names_file_and_line(tmp_path):
    path = write_rows(tmp_path / "nq_hotpotqa_train_train.jsonl", search_rows("train", {"nq": 2}))
    path.write_text(path.read_text() + '{"question": "q?", "data_source": "nq"}\n')
    with pytest.raises(DataError, match=r"nq_hotpotqa_train_train\.jsonl:3: missing field\(s\) \['golden_answers'\]"):
        load_questions("nq_hotpotqa_train", None, str(tmp_path))


def test_world_stays_the_default():
    assert drmas_envs.env_dataset("search-3agent").provenance["origin"] == "generated"


@needs_pyarrow
@pytest.mark.skipif(not (SHARED / "search").is_dir(), reason="../shared/data is not available")
def test_sampled_from_real_questions_in_the_search_r1_layout(tmp_path):
    """test.parquet rebuilt from the real NQ/TriviaQA/HotpotQA/2Wiki copies (first 40 each) + fixtures for the rest."""
    rows = []
    for source in SEARCH_SOURCES:
        if source in SHARED_TEST:
            lines = (SHARED / "search" / f"{SHARED_TEST[source]}.jsonl").read_text().splitlines()[:40]
            real = [json.loads(line) for line in lines]
            rows += [
                {"id": q["id"], "question": q["question"], "golden_answers": q["golden_answers"], "data_source": source}
                for q in real
            ]
        else:
            rows += search_rows("test", {source: 35})
    write_rows(tmp_path.joinpath(*REPO) / "test.parquet", rows)
    items = load_questions("search_test_sampled", None, str(tmp_path))
    assert Counter(q["source"] for q in items) == dict.fromkeys(SEARCH_SOURCES, 30)
    nq = [json.loads(line) for line in (SHARED / "search" / "nq_test.jsonl").read_text().splitlines()[:30]]
    assert [(q["question"], q["golden_answers"]) for q in items[:30]] == [
        (q["question"].strip(), q["golden_answers"]) for q in nq
    ]
