"""Math data: JSONL files, known names from a local data dir, errors naming file and line, the generated set."""

import json
import os
from pathlib import Path

import pytest

import drmas_envs
from drmas_envs import DataError, hub
from drmas_envs.math import datasets, generated

SHARED_MATH = Path(os.environ.get("DRMAS_DATA_DIR") or Path(__file__).parents[2].parent / "shared" / "data") / "math"


def write(path, lines):
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def test_jsonl_path_fields_and_defaults(tmp_path):
    f = write(
        tmp_path / "mine.jsonl", [{"problem": "1+1?", "answer": 2}, "", {"problem": "p", "answer": "x", "id": "q"}]
    )
    env = drmas_envs.make("math-1agent", dataset=str(f))
    tasks = env.unwrapped.tasks
    assert [t["answer"] for t in tasks] == ["2", "x"]
    assert [t["id"] for t in tasks] == ["mine-0", "q"] and {t["source"] for t in tasks} == {"mine"}


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("{not json", "not valid JSON"),
        ('{"problem": "p"}', "missing field"),
        ('{"problem": "p", "answer": ""}', "answer"),
        ('{"problem": "", "answer": "1"}', "problem"),
        ('{"problem": "p", "answer": {"a": 1}}', "answer"),
        ("[1, 2]", "JSON object"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"problem": "p", "answer": ' + "9" * 5_000 + "}", "not readable JSON"),
    ],
)
def test_malformed_file_names_path_and_line(tmp_path, line, why):
    f = write(tmp_path / "bad.jsonl", ['{"problem": "ok", "answer": "1"}', line])
    with pytest.raises(DataError, match=rf"bad\.jsonl:2: .*{why}"):
        drmas_envs.make("math-2agent", dataset=str(f))


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_a_byte_that_is_not_utf8_names_its_line(tmp_path, suffix):
    import gzip

    body = b'{"problem": "ok", "answer": "1"}\n{"problem": "caf\xe9", "answer": "2"}\n'
    f = tmp_path / f"bad{suffix}"
    f.write_bytes(gzip.compress(body) if suffix.endswith(".gz") else body)
    with pytest.raises(DataError, match=rf"bad{suffix.replace('.', chr(92) + '.')}:2: not UTF-8 text \(byte 0xe9"):
        drmas_envs.make("math-2agent", dataset=str(f))


def test_missing_file_and_unknown_name():
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        drmas_envs.make("math-2agent", dataset="/no/where/nope.jsonl")
    with pytest.raises(ValueError, match="math500"):
        drmas_envs.make("math-2agent", dataset="not_a_dataset")
    with pytest.raises(ValueError, match="no split"):
        drmas_envs.make("math-2agent", dataset="math500", split="train")


def test_known_name_not_local_and_no_hub_names_the_dirs(tmp_path, monkeypatch):
    monkeypatch.delenv("DRMAS_DATA_DIR", raising=False)
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        drmas_envs.make("math-2agent", dataset="aime_train", data_dir=tmp_path)


def test_known_name_from_data_dir_and_env_var(tmp_path, monkeypatch):
    (tmp_path / "math").mkdir()
    write(tmp_path / "math" / "gsm8k_test.jsonl", [{"problem": "a", "answer": "1", "source": "gsm8k_test"}])
    write(tmp_path / "gsm8k_train.jsonl", [{"problem": "b", "answer": "2"}, {"problem": "c", "answer": "3"}])
    assert len(drmas_envs.make("math-2agent", dataset="gsm8k", data_dir=tmp_path).unwrapped.tasks) == 1
    monkeypatch.setenv("DRMAS_DATA_DIR", str(tmp_path))
    env = drmas_envs.make("math-2agent", dataset="gsm8k", split="train")
    assert [t["problem"] for t in env.unwrapped.tasks] == ["b", "c"]


def test_loads_are_cached_and_reloaded_when_the_file_changes(tmp_path):
    f = write(tmp_path / "c.jsonl", [{"problem": "a", "answer": "1"}])
    first = datasets.load_jsonl_tasks(f)
    assert datasets.load_jsonl_tasks(f) is first
    write(f, [{"problem": "a", "answer": "1"}, {"problem": "bb", "answer": "2"}])
    assert len(datasets.load_jsonl_tasks(f)) == 2


def test_hub_field_mapping():
    hub = datasets.HubSource("x/y", "test", answer_keys=("solution",))
    t = datasets.normalise_item({"problem": "p", "solution": "so \\boxed{\\frac{1}{2}}."}, "w", "src", 0, hub)
    assert t["answer"] == "\\frac{1}{2}" and t["source"] == "src"
    gsm = datasets.HubSource("openai/gsm8k", "test", config="main")
    assert (
        datasets.normalise_item({"question": "q", "answer": "x\n#### 1,200"}, "w", "gsm8k", 0, gsm)["answer"] == "1200"
    )


@pytest.mark.skipif(not SHARED_MATH.is_dir(), reason="shared math data not present")
@pytest.mark.parametrize(("name", "n"), [("math500", 500), ("aime24", 30), ("amc23", 40), ("minerva", 272)])
def test_known_names_resolve_in_shared_data(name, n):
    env = drmas_envs.make("math-2agent", dataset=name, data_dir=SHARED_MATH.parent)
    assert len(env.unwrapped.tasks) == n
    env.reset(seed=0)
    assert env.observe("solver")["user"].startswith("Problem:")


def test_generated_levels_are_deterministic_and_tagged():
    a = generated.generate((1, 2, 3, 4, 5), 50, seed=3)
    assert a == generated.generate((1, 2, 3, 4, 5), 50, seed=3)
    assert a != generated.generate((1, 2, 3, 4, 5), 50, seed=4)
    assert {t["source"] for t in a} == {f"generated/L{i}" for i in range(1, 6)}
    test = generated.generate(1, 50, seed=3, split="test")
    assert not {t["problem"] for t in test} & {t["problem"] for t in a if t["level"] == 1}


def test_level1_is_single_digit():
    for t in generated.generate(1, 500):
        numbers = [int(x) for x in __import__("re").findall(r"\d+", t["problem"])]
        assert all(0 <= x <= 9 for x in numbers) and 0 <= int(t["answer"]) <= 9, t


def test_generated_answers_are_right():
    # recompute each bare arithmetic problem independently of the generator
    import re
    from fractions import Fraction

    checked = 0
    for t in generated.generate((1, 2, 3, 4, 5), 200):
        m = re.fullmatch(r"What is \$(.*)\$\?.*", t["problem"])
        if not m:
            continue
        expr = re.sub(r"\\frac\{(\d+)\}\{(\d+)\}", r"Fraction(\1, \2)", m.group(1))
        expr = expr.replace("\\times", "*").replace("\\div", "/")
        value = eval(expr, {"Fraction": Fraction})  # our own generated arithmetic, not model text
        ref = t["answer"]
        fm = re.fullmatch(r"(-?)\\frac\{(\d+)\}\{(\d+)\}", ref)
        expected = (-1 if fm.group(1) else 1) * Fraction(int(fm.group(2)), int(fm.group(3))) if fm else Fraction(ref)
        assert Fraction(value) == expected, t
        checked += 1
    assert checked > 300


def test_bad_generated_options():
    with pytest.raises(ValueError, match="levels"):
        drmas_envs.make("math-2agent", level=7)
    with pytest.raises(ValueError, match="split"):
        drmas_envs.make("math-2agent", split="dev")


def test_hub_fallback_file_selection_and_field_mapping(tmp_path, monkeypatch):
    """The hub transport is replaced by local files (no network here); selection, parsing and provenance are real."""
    from types import SimpleNamespace

    huggingface_hub = pytest.importorskip("huggingface_hub")
    files = {
        "main/test-00000.jsonl": [{"question": "Q1", "answer": "work\n#### 1,234"}],
        "main/train-00000.jsonl": [{"question": "T", "answer": "#### 1"}],
        "README.md": [],
    }
    for name, rows in files.items():
        write(tmp_path / name.replace("/", "__"), rows)
    siblings = [SimpleNamespace(rfilename=f) for f in files]
    lookups = []

    def dataset_info(self, repo, revision=None):
        lookups.append(repo)
        return SimpleNamespace(sha="abc123", siblings=siblings)

    monkeypatch.setattr(huggingface_hub.HfApi, "dataset_info", dataset_info)
    monkeypatch.setattr(
        huggingface_hub,
        "hf_hub_download",
        lambda repo, f, repo_type=None, revision=None: str(tmp_path / f.replace("/", "__")),
    )
    monkeypatch.delenv("DRMAS_DATA_DIR", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub._fetch_cached.cache_clear()
    try:
        tasks = datasets.load_tasks("gsm8k", data_dir=tmp_path / "empty")
        again = datasets.load_tasks("gsm8k", data_dir=tmp_path / "empty")
    finally:
        hub._fetch_cached.cache_clear()
    assert lookups == ["openai/gsm8k"] and again[0] is tasks[0]  # one hub lookup per split and process
    assert [(t["problem"], t["answer"], t["source"]) for t in tasks] == [("Q1", "1234", "gsm8k")]
    assert tasks.provenance == {
        "dataset": "gsm8k",
        "split": "test",
        "n": 1,
        "origin": "hub",
        "repo": "openai/gsm8k",
        "revision": "abc123",
        "hub_split": "test",
        "hub_files": ["main/test-00000.jsonl"],
        "config": "main",
    }
