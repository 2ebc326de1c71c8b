"""Math datasets: JSONL files, known names (local data directory first, then the Hugging Face hub).

Every item becomes a dict with at least `id`, `problem`, `answer` (a non-empty string) and `source`;
other fields are kept. Loads are cached per file (path, size, mtime), so the hundreds of `make()`
calls of an evaluation or a training run read each file once.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drmas_envs.data import DATA_DIR_ENV, DataError, data_dirs, find_local, iter_jsonl_numbered
from drmas_envs.math.answers import last_boxed

logger = logging.getLogger(__name__)

Task = dict[str, Any]


@dataclass(frozen=True)
class HubSource:
    """Where a known dataset lives on the Hugging Face hub, and which fields hold problem and answer."""

    repo: str
    split: str
    problem_keys: tuple[str, ...] = ("problem", "question", "Problem")
    answer_keys: tuple[str, ...] = ("answer", "final_answer", "Answer", "solution")
    config: str | None = None


@dataclass(frozen=True)
class KnownDataset:
    """A dataset known by name: local file names per split, and a hub fallback per split."""

    files: Mapping[str, tuple[str, ...]]
    hub: Mapping[str, HubSource]
    default_split: str


def _known(split: str, files: tuple[str, ...], hub: HubSource | None) -> KnownDataset:
    return KnownDataset({split: files}, {split: hub} if hub else {}, split)


# Hub ids are the public copies these sets are commonly evaluated from; they cannot be fetched on an
# offline machine, where the local files (e.g. data/math/*.jsonl) are used instead.
KNOWN: dict[str, KnownDataset] = {
    "math500": _known("test", ("math500.jsonl",), HubSource("HuggingFaceH4/MATH-500", "test")),
    "aime24": _known("test", ("aime24.jsonl", "aime_2024.jsonl"), HubSource("HuggingFaceH4/aime_2024", "train")),
    "aime25": _known("test", ("aime25.jsonl", "aime_2025.jsonl"), HubSource("math-ai/aime25", "test")),
    "amc23": _known("test", ("amc23.jsonl",), HubSource("math-ai/amc23", "test")),
    "minerva": _known("test", ("minerva_math.jsonl", "minerva.jsonl"), HubSource("math-ai/minervamath", "test")),
    "olympiadbench": _known(
        "test", ("olympiadbench.jsonl",), HubSource("math-ai/olympiadbench", "test", answer_keys=("final_answer",))
    ),
    "gsm8k": KnownDataset(
        {"test": ("gsm8k_test.jsonl", "gsm8k.jsonl"), "train": ("gsm8k_train.jsonl",)},
        {s: HubSource("openai/gsm8k", s, config="main") for s in ("test", "train")},
        "test",
    ),
    "math_train": _known(
        "train",
        ("math_train.jsonl",),
        HubSource("DigitalLearningGmbH/MATH-lighteval", "train", answer_keys=("solution",)),
    ),
    "dapo": _known(
        "train",
        ("dapo.jsonl", "dapo_math_17k.jsonl"),
        HubSource("open-r1/DAPO-Math-17k-Processed", "train", ("prompt",), ("solution",), config="en"),
    ),
    "aime_train": _known("train", ("aime_1983_2023_train.jsonl",), None),
    "amc22_23": _known("test", ("amc_2022_2023.jsonl",), None),
}
KNOWN["math"] = KnownDataset(
    {"train": KNOWN["math_train"].files["train"], "test": KNOWN["math500"].files["test"]},
    {"train": KNOWN["math_train"].hub["train"], "test": KNOWN["math500"].hub["test"]},
    "test",
)


def _answer_text(value: Any, key: str) -> str | None:
    """A reference answer as a string; a solution text yields its last box; lists are joined."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, list) and value and all(isinstance(v, (str, int, float)) for v in value):
        return ", ".join(str(v) for v in value)
    if isinstance(value, str):
        if key == "solution" and "\\boxed" in value:
            return last_boxed(value)
        if "####" in value:  # GSM8K: the final answer follows "####"
            return value.rsplit("####", 1)[1].strip().replace(",", "")
        return value.strip()
    return None


def _pick(item: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str, Any] | None:
    return next(((k, item[k]) for k in keys if k in item), None)


def normalise_item(item: Mapping[str, Any], where: str, source: str, index: int, hub: HubSource | None = None) -> Task:
    """One dataset item as a task dict; `where` ("file:line") names it in errors."""
    problem_keys = hub.problem_keys if hub else ("problem",)
    answer_keys = hub.answer_keys if hub else ("answer",)
    picked_p, picked_a = _pick(item, problem_keys), _pick(item, answer_keys)
    if picked_p is None or not isinstance(picked_p[1], str) or not picked_p[1].strip():
        raise DataError(f"{where}: `{'|'.join(problem_keys)}` must be a non-empty string")
    answer = _answer_text(picked_a[1], picked_a[0]) if picked_a else None
    if not answer:
        raise DataError(f"{where}: `{'|'.join(answer_keys)}` must be a non-empty string, number or list")
    task = {k: v for k, v in item.items() if isinstance(k, str)}
    task.update(problem=picked_p[1], answer=answer)
    task["id"] = str(item.get("id", f"{source}-{index}"))
    task["source"] = str(item.get("source") or source)
    return task


@functools.lru_cache(maxsize=64)
def _load_file(path: str, size: int, mtime_ns: int) -> tuple[Task, ...]:
    source = Path(path).name.split(".")[0]
    return tuple(
        normalise_item(item, f"{path}:{lineno}", source, i)
        for i, (lineno, item) in enumerate(iter_jsonl_numbered(path, required=("problem", "answer")))
    )


def load_jsonl_tasks(path: str | os.PathLike) -> tuple[Task, ...]:
    """The tasks of a JSONL file (fields `problem`, `answer`, optional `id`, `source`), cached.

    Raises:
        DataError: a malformed line, named by path and line number.
        FileNotFoundError: no such file.

    """
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise FileNotFoundError(f"dataset file not found: {p}")
    st = p.stat()
    tasks = _load_file(str(p), st.st_size, st.st_mtime_ns)
    if not tasks:
        raise DataError(f"{p}: no items")
    return tasks


def looks_like_path(dataset: str) -> bool:
    """Whether `dataset` names a file rather than a known dataset."""
    return dataset.endswith((".jsonl", ".jsonl.gz", ".json")) or os.sep in dataset or Path(dataset).is_file()


def load_tasks(dataset: str, split: str | None = None, data_dir: str | os.PathLike | None = None) -> tuple[Task, ...]:
    """Resolve `dataset` (a JSONL path or a known name) and `split` to a tuple of tasks.

    Known names are looked up as `<data dir>/<file>` and `<data dir>/math/<file>` in `data_dir` and
    $DRMAS_DATA_DIR, and otherwise fetched from the Hugging Face hub.
    """
    if looks_like_path(dataset):
        if split not in (None, "", "test", "train"):
            logger.info("split %r ignored for the file %s", split, dataset)
        return load_jsonl_tasks(dataset)
    name = dataset.lower().replace("-", "_")
    if name not in KNOWN:
        raise ValueError(f"unknown math dataset {dataset!r}: give a JSONL path or one of {sorted(KNOWN)}")
    known = KNOWN[name]
    split = split or known.default_split
    if split not in known.files:
        raise ValueError(f"dataset {dataset!r} has no split {split!r}; splits: {sorted(known.files)}")
    names = known.files[split]
    local = find_local([*names, *(f"math/{n}" for n in names)], data_dir)
    if local is not None:
        return load_jsonl_tasks(local)
    hub = known.hub.get(split)
    searched = [str(d) for d in data_dirs(data_dir)] or [f"(none: pass data_dir= or set ${DATA_DIR_ENV})"]
    if hub is None:
        raise FileNotFoundError(f"dataset {dataset!r} ({split}): none of {list(names)} in {searched}")
    return _load_hub_cached(hub, name)


@functools.lru_cache(maxsize=16)
def _load_hub_cached(hub: HubSource, source: str) -> tuple[Task, ...]:
    rows = load_hub_rows(hub)
    return tuple(normalise_item(r, f"hf://{hub.repo}[{hub.split}] row {i}", source, i, hub) for i, r in enumerate(rows))


def load_hub_rows(hub: HubSource) -> list[dict[str, Any]]:
    """Download one split of a hub dataset (JSON, JSONL or Parquet files) and return its rows.

    Needs `huggingface_hub` (and `pyarrow` for Parquet) and network access; neither is exercised in
    this project's offline tests.
    """
    try:
        from huggingface_hub import HfApi, hf_hub_download
    except ImportError:
        raise DataError(
            f"dataset {hub.repo!r} is not in a local data directory and `huggingface_hub` is not installed; "
            f"`pip install huggingface_hub` or put the JSONL file in ${DATA_DIR_ENV}"
        ) from None
    files = HfApi().list_repo_files(hub.repo, repo_type="dataset")
    prefix = f"{hub.config}/" if hub.config and any(f.startswith(f"{hub.config}/") for f in files) else ""
    data_files = [f for f in files if f.startswith(prefix) and f.endswith((".jsonl", ".json", ".parquet"))]
    # "<split>.jsonl", "<split>-00000-of-00001.parquet", or files under a "<split>/" folder
    wanted = [f for f in data_files if Path(f).name.startswith(hub.split) or f"/{hub.split}/" in f"/{f}"]
    if not wanted:
        raise DataError(f"no {hub.split!r} data files (jsonl/json/parquet) found in hub dataset {hub.repo!r}")
    rows: list[dict[str, Any]] = []
    for f in sorted(wanted):
        local = hf_hub_download(hub.repo, f, repo_type="dataset")
        rows.extend(_read_rows(Path(local)))
    return rows


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError(f"{path} is Parquet; `pip install pyarrow` to read it") from None
        return pq.read_table(path).to_pylist()
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, list) else data.get("data", [])
    return [item for _, item in iter_jsonl_numbered(path)]
