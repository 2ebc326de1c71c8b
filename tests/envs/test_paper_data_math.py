"""The paper's math data by name: dapo_filter, the validation and test mixes, local hub-layout copies, provenance."""

import hashlib
import json
import os
import pickle
from collections import Counter
from pathlib import Path

import pytest
from paper_fixtures import (
    aime25_rows,
    math500_rows,
    needs_pyarrow,
    write_math_hub_layout,
    write_rows,
)

import drmas_envs
from drmas_envs import DataError, DatasetNotFoundError
from drmas_envs.math import datasets

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No test here may reach the hub: the not-found path is what a machine without network sees."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("DRMAS_DATA_DIR", raising=False)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_test_sampled_is_math500_first50_and_both_aimes(tmp_path):
    files = write_math_hub_layout(tmp_path, {"math500": 60, "aime24": 30, "aime25": 30})
    tasks = datasets.load_tasks("math_test_sampled", data_dir=tmp_path)
    assert len(tasks) == 110
    assert Counter(t["source"] for t in tasks) == {"math500_first50": 50, "aime24": 30, "aime25": 30}
    assert [t["problem"] for t in tasks[:50]] == [r["problem"] for r in math500_rows(50)]
    assert [t["source"] for t in tasks] == ["math500_first50"] * 50 + ["aime24"] * 30 + ["aime25"] * 30
    assert tasks[80]["answer"] == "200" and len({t["id"] for t in tasks}) == 110  # int answer -> text; ids unique
    members = tasks.provenance["members"]
    assert [(m["source"], m["take"], m["dataset"]) for m in members] == [
        ("math500_first50", 50, "math500"),
        ("aime24", 30, "aime24"),
        ("aime25", 30, "aime25"),
    ]
    for m, name in zip(members, ("math500", "aime24", "aime25")):
        assert m["origin"] == "local" and m["files"][0]["sha256"] == sha256(files[name])
    env = drmas_envs.make("math-2agent", dataset="math_test_sampled", data_dir=tmp_path)
    assert len(env.unwrapped.tasks) == 110 and drmas_envs.dataset_provenance(env) == tasks.provenance


def test_full_test_mix_has_the_six_sources_in_the_reference_order(tmp_path):
    counts = {"math500": 12, "aime24": 30, "aime25": 30, "olympiadbench": 7, "amc23": 4, "minerva": 5}
    write_math_hub_layout(tmp_path, counts)
    tasks = datasets.load_tasks("math_test", data_dir=tmp_path)
    assert Counter(t["source"] for t in tasks) == counts
    assert list(dict.fromkeys(t["source"] for t in tasks)) == list(counts)
    assert tasks.provenance["n"] == sum(counts.values())


@needs_pyarrow
def test_mix_from_parquet_shards(tmp_path):
    write_math_hub_layout(tmp_path, {"math500": 50, "aime24": 30, "aime25": 30}, parquet=True)
    tasks = datasets.load_tasks("math_test_sampled", data_dir=tmp_path)
    assert Counter(t["source"] for t in tasks) == {"math500_first50": 50, "aime24": 30, "aime25": 30}
    assert tasks[-1]["answer"] == "229"


@pytest.mark.skipif(not (SHARED / "math").is_dir(), reason="../shared/data is not available")
def test_test_sampled_from_shared_data_and_a_fixture_for_aime25(tmp_path, monkeypatch):
    """math500 and aime24 from the real copies (via $DRMAS_DATA_DIR); aime25, which they lack, from a fixture."""
    write_rows(tmp_path / "MathArena" / "aime_2025" / "data" / "train-00000-of-00001.jsonl", aime25_rows())
    monkeypatch.setenv("DRMAS_DATA_DIR", str(SHARED))
    tasks = datasets.load_tasks("math_test_sampled", data_dir=tmp_path)
    assert Counter(t["source"] for t in tasks) == {"math500_first50": 50, "aime24": 30, "aime25": 30}
    real500 = [json.loads(line)["problem"] for line in (SHARED / "math" / "math500.jsonl").read_text().splitlines()]
    assert [t["problem"] for t in tasks[:50]] == real500[:50]
    sources = [m["files"][0]["path"] for m in tasks.provenance["members"]]
    assert sources[0].endswith("math500.jsonl") and sources[1].endswith("aime24.jsonl")
    assert str(tmp_path) in sources[2]


@pytest.mark.skipif(not (SHARED / "math").is_dir(), reason="../shared/data is not available")
def test_full_test_mix_from_shared_data_and_fixtures_for_what_it_lacks(tmp_path, monkeypatch):
    """MATH-500, AIME 2024, AMC 23 and Minerva from the real copies; AIME 2025 and OlympiadBench from fixtures."""
    write_math_hub_layout(tmp_path, {"aime25": 30, "olympiadbench": 9})
    monkeypatch.setenv("DRMAS_DATA_DIR", str(SHARED))
    tasks = drmas_envs.env_dataset("math-2agent", dataset="math_test", data_dir=tmp_path)
    counts = {"math500": 500, "aime24": 30, "aime25": 30, "olympiadbench": 9, "amc23": 40, "minerva": 272}
    assert Counter(t["source"] for t in tasks) == counts
    assert list(dict.fromkeys(t["source"] for t in tasks)) == list(counts)
    assert len({t["id"] for t in tasks}) == len(tasks) and all(t["answer"] for t in tasks)


@needs_pyarrow
def test_dapo_filter_verl_rows_and_dapo_stay_apart(tmp_path):
    suffix = "\n\nLet's think step by step and output the final answer within \\boxed{}."
    rows = [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": f"Find x if x + {i} = {2 * i}.{suffix}"}],
            "ability": "MATH",
            "reward_model": {"style": "rule", "ground_truth": str(i)},
            "extra_info": {"index": i},
        }
        for i in range(1, 6)
    ]
    write_rows(tmp_path / "aaabiao" / "dapo_filter" / "data" / "train-00000-of-00001.parquet", rows)
    tasks = drmas_envs.make("math-2agent", dataset="dapo_filter", data_dir=tmp_path).unwrapped.tasks
    assert [(t["problem"], t["answer"]) for t in tasks][:2] == [
        ("Find x if x + 1 = 2.", "1"),
        ("Find x if x + 2 = 4.", "2"),
    ]
    assert {t["source"] for t in tasks} == {"dapo_filter"}
    with pytest.raises(DatasetNotFoundError, match="open-r1/DAPO-Math-17k-Processed"):
        datasets.load_tasks("dapo", data_dir=tmp_path)


def test_not_found_names_the_dataset_places_and_the_fetch_command(tmp_path):
    with pytest.raises(DatasetNotFoundError) as err:
        drmas_envs.make("math-2agent", dataset="dapo_filter", data_dir=tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("dataset 'dapo_filter [train]' not found")
    assert str(tmp_path / "dapo_filter.jsonl") in msg and str(tmp_path / "aaabiao" / "dapo_filter") in msg
    assert "HF_HUB_OFFLINE" in msg
    assert f"hf download aaabiao/dapo_filter --repo-type dataset --local-dir {tmp_path}/aaabiao/dapo_filter" in msg
    with pytest.raises(DatasetNotFoundError, match=r"no local data directory \(pass data_dir= or set \$DRMAS_DATA_DIR"):
        datasets.load_tasks("aime25")


def test_mix_not_found_lists_only_the_missing_members(tmp_path):
    write_math_hub_layout(tmp_path, {"math500": 50, "aime24": 30})
    with pytest.raises(DatasetNotFoundError) as err:
        drmas_envs.env_dataset("math-2agent", dataset="math_test_sampled", data_dir=tmp_path)
    msg = str(err.value)
    assert "1 member(s) missing" in msg and "MathArena/aime_2025" in msg
    assert "HuggingFaceH4/MATH-500" not in msg


def test_generated_set_stays_the_default():
    env = drmas_envs.make("math-2agent")
    assert drmas_envs.dataset_provenance(env)["origin"] == "generated"
    assert all(t["source"].startswith("generated/") for t in env.unwrapped.tasks)


def test_malformed_hub_layout_files_name_file_and_line(tmp_path):
    path = write_rows(tmp_path / "HuggingFaceH4" / "aime_2024" / "data" / "train-00000-of-00001.jsonl", aime25_rows(3))
    path.write_text(path.read_text() + '{"problem": "", "answer": "1"}\n')
    with pytest.raises(DataError, match=r"train-00000-of-00001\.jsonl:4: `problem"):
        datasets.load_tasks("aime24", data_dir=tmp_path)


@needs_pyarrow
def test_malformed_parquet_row_names_file_and_row(tmp_path):
    rows = [{"problem": "ok", "answer": "1"}, {"problem": "no answer", "answer": None}]
    path = write_rows(tmp_path / "realtreetune" / "olympiadbench" / "data" / "test-00000-of-00001.parquet", rows)
    with pytest.raises(DataError, match=rf"{path}: row 2: `answer"):
        datasets.load_tasks("olympiadbench", data_dir=tmp_path)
    (tmp_path / "x.parquet").write_text("not parquet")
    with pytest.raises(DataError, match=r"x\.parquet: not a readable Parquet file"):
        datasets.load_tasks(str(tmp_path / "x.parquet"))


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(__import__("sys").modules, "pyarrow", None)  # as on an install without the extra
    monkeypatch.setitem(__import__("sys").modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match=r"t\.parquet is a Parquet file; reading it needs pyarrow: pip install pyarrow"):
        datasets.load_tasks(str(tmp_path / "t.parquet"))


def test_provenance_of_a_local_file_pickles_and_env_dataset_matches_make(tmp_path):
    f = write_rows(tmp_path / "aime25.jsonl", [{"problem": "p", "answer": "7"}])
    tasks = drmas_envs.env_dataset("math-1agent", dataset="aime25", data_dir=tmp_path)
    assert tasks.provenance == {
        "dataset": "aime25",
        "split": "test",
        "n": 1,
        "origin": "local",
        "files": [{"path": str(f.resolve()), "bytes": f.stat().st_size, "sha256": sha256(f)}],
    }
    assert pickle.loads(pickle.dumps(tasks)).provenance == tasks.provenance
    env = drmas_envs.make("math-1agent", dataset="aime25", data_dir=tmp_path)
    assert drmas_envs.dataset_provenance(env) == tasks.provenance
    assert env.unwrapped.tasks[0] is tasks[0]  # the same cached items


def test_data_dir_argument_wins_over_the_environment_variable(tmp_path, monkeypatch):
    first, second = tmp_path / "a", tmp_path / "b"
    write_rows(first / "aime25.jsonl", [{"problem": "from a", "answer": "1"}])
    write_rows(second / "MathArena" / "aime_2025" / "train.jsonl", [{"problem": "from b", "answer": 2}])
    monkeypatch.setenv("DRMAS_DATA_DIR", os.fspath(second))
    assert datasets.load_tasks("aime25")[0]["problem"] == "from b"
    assert datasets.load_tasks("aime25", data_dir=first)[0]["problem"] == "from a"


def test_local_hub_copy_records_the_downloaded_revision(tmp_path):
    """`hf download --local-dir` keeps `.cache/huggingface/download/<file>.metadata` (commit hash first)."""
    root = tmp_path / "MathArena" / "aime_2025"
    write_rows(root / "data" / "train-00000-of-00001.jsonl", aime25_rows(2))
    meta = root / ".cache" / "huggingface" / "download" / "data" / "train-00000-of-00001.jsonl.metadata"
    meta.parent.mkdir(parents=True)
    meta.write_text('0123456789abcdef0123456789abcdef01234567\n"etag"\n1764900000.0\n')
    (meta.parent / "train-00000-of-00001.jsonl.lock").write_text("")
    tasks = datasets.load_tasks("aime25", data_dir=tmp_path)
    assert len(tasks) == 2
    assert tasks.provenance["files"][0]["revision"] == "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    ("files", "split", "picked"),
    [
        (["README.md", "test.jsonl", "test_sampled.jsonl"], "test", ["test.jsonl"]),
        (["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"], "train", None),
        (["dapo_filter_train.parquet", "dapo_filter_eval.parquet"], "train", ["dapo_filter_train.parquet"]),
        (["dapo_filter.parquet"], "train", ["dapo_filter.parquet"]),  # one unnamed file: `datasets` calls it train
        (["dapo_filter.parquet"], "test", []),
        (["all.jsonl", "dev.jsonl"], "train", []),
    ],
)
def test_split_files_follow_the_hub_naming(files, split, picked):
    from drmas_envs.tables import split_files

    assert split_files(files, split) == (files if picked is None else picked)


def test_split_files_of_a_config_never_come_from_another():
    from drmas_envs.tables import split_files

    files = ["main/test-0.jsonl", "main/train-0.jsonl", "socratic/test-0.jsonl", "nq/test.jsonl"]
    assert split_files(files, "test", config="main") == ["main/test-0.jsonl"]
    assert split_files(files, "test", config="bamboogle") == []
