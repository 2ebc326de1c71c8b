"""Question sets and corpora for the search envs: files, known names, the paper's sets, or the generated world.

Known names are looked up in a local data directory (flat files such as `search/nq_test.jsonl`, or the
hub repo's own layout), then on the Hugging Face hub (see `drmas_envs.hub`). The paper's sets come from
the Search-R1 repo the reference downloads (`PeterJinGo/nq_hotpotqa_train`: `train.parquet`, the NQ +
HotpotQA training mix, and `test.parquet`, the 7 QA test sets): `nq_hotpotqa_train`, `search_test`, and
`search_test_sampled` (the first 30 questions of each test source, as the reference's validation set).
Loaded sets are cached (`make()` is called for every episode batch), so repeated loads are free; every
load returns a `TaskSet` whose `provenance` says where it came from.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from drmas_envs.data import DATA_DIR_ENV, BadRows, DataError, RowErrors, find_local
from drmas_envs.hub import HubSplit, locate
from drmas_envs.provenance import TaskSet, file_provenance
from drmas_envs.search.heldout import WorldKind, heldout_questions, world_keys
from drmas_envs.search.world import generate_world
from drmas_envs.tables import iter_rows

logger = logging.getLogger(__name__)

HUB_REPO = "RUC-NLPIR/FlashRAG_datasets"
"""The Hugging Face dataset repo used by Search-R1 and FlashRAG: `<name>/<split>.jsonl` files."""

PAPER_REPO = "PeterJinGo/nq_hotpotqa_train"
"""The Search-R1 repo the reference's preprocessing downloads: `train.parquet` and `test.parquet`."""

PAPER_SETS: dict[str, tuple[str, int | None]] = {
    "nq_hotpotqa_train": ("train", None),
    "search_test": ("test", None),
    "search_test_sampled": ("test", 30),
}
"""The paper's sets: name -> (file of `PAPER_REPO`, how many questions per `data_source`; None: all)."""

DEFAULT_SPLITS = {
    "nq": "test",
    "triviaqa": "test",
    "popqa": "test",
    "hotpotqa": "dev",
    "2wikimultihopqa": "dev",
    "musique": "dev",
    "bamboogle": "test",
}
"""The known FlashRAG dataset names and the split the paper evaluates on."""

WORLD_NAMES = (None, "", "default", "world")
CORPUS_CANDIDATES = ("corpus/wiki_passages.jsonl.gz", "wiki_passages.jsonl.gz", "corpus/wiki-18.jsonl", "wiki-18.jsonl")
"""Where a local data directory may hold the corpus used with the known (Wikipedia) datasets."""

_COLUMNS = ("id", "question", "golden_answers", "data_source", "source", "reward_model", "env_kwargs", "extra_info")


def _nested(item: dict[str, Any], outer: str, key: str) -> Any:
    inner = item.get(outer)
    return inner.get(key) if isinstance(inner, dict) else None


def _answers(item: dict[str, Any], where: str) -> list[str]:
    gold = item.get("golden_answers")
    if gold is None:  # the reference's preprocessed rows (drmas_search.py): env_kwargs.ground_truth
        gold = _nested(item, "env_kwargs", "ground_truth")
        gold = gold.get("target") if isinstance(gold, dict) else gold
    if gold is None and isinstance(item.get("reward_model"), dict):  # verl/Search-R1 rows: ground_truth.target
        truth = item["reward_model"].get("ground_truth")
        gold = truth.get("target") if isinstance(truth, dict) else truth
    if isinstance(gold, str):
        gold = [gold]
    if not isinstance(gold, list) or not gold or not all(isinstance(g, (str, int, float)) for g in gold):
        raise DataError(f"{where}: `golden_answers` must be a non-empty list of strings")
    return [str(g) for g in gold]


def _question(item: dict[str, Any], where: str, index: int, source: str) -> dict[str, Any]:
    if "question" not in item:  # the reference's preprocessed rows keep it in env_kwargs / extra_info
        found = _nested(item, "env_kwargs", "question") or _nested(item, "extra_info", "question")
        item = {**item, "question": found} if found is not None else item
    missing = [f for f in ("question", "golden_answers") if f not in item]
    if missing == ["golden_answers"] and ("reward_model" in item or _nested(item, "env_kwargs", "ground_truth")):
        missing = []
    if missing:
        raise DataError(f"{where}: missing field(s) {missing}")
    if not isinstance(item["question"], str) or not item["question"].strip():
        raise DataError(f"{where}: `question` must be a non-empty string")
    return {
        "id": str(item.get("id", f"{source}-{index}")),
        "question": item["question"].strip(),
        "golden_answers": _answers(item, where),
        "source": str(item.get("source") or item.get("data_source") or source),
    }


def read_questions(path: str | os.PathLike, errors: RowErrors | None = None) -> list[dict[str, Any]]:
    """Questions from a JSONL or Parquet file with `question`, `golden_answers`, optional `id` and `source`.

    `source` defaults to the row's `data_source`, then the file's stem; `evaluate` reports per source.
    Search-R1 / verl rows (`reward_model.ground_truth.target`) and the files the reference's preprocessing
    writes (`examples/data_preprocess/drmas_search.py`: `env_kwargs.question`, `env_kwargs.ground_truth`)
    are read too. `errors` (default: raise) decides what a malformed row does.

    Raises:
        DataError: a malformed line or row (named by file and line/row).

    """
    path, errors = Path(path), errors or RowErrors()
    stem = path.name.split(".")[0]
    items = []
    for i, (where, item) in enumerate(iter_rows(path, _COLUMNS, on_error=errors)):
        try:
            items.append(_question(item, where, i, stem))
        except DataError as exc:
            errors(exc)
    if errors.count:
        logger.warning("%s: skipped %d malformed row(s), first: %s", path, errors.count, "; ".join(errors.first))
    if not items:
        raise DataError(f"{path}: no questions")
    return items


def _local_candidates(name: str, split: str) -> list[str]:
    return [f"{name}_{split}.jsonl", f"{name}/{split}.jsonl"]


def _first_per_source(items: Sequence[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The first `n` items of each source, sources in order of first appearance (the reference's sampling)."""
    taken: dict[str, int] = {}
    out = []
    for q in items:
        if taken.get(q["source"], 0) < n:
            taken[q["source"]] = taken.get(q["source"], 0) + 1
            out.append(q)
    return out


def _known(name: str, split: str, data_dir: str | None, errors: RowErrors) -> TaskSet:
    found = locate(
        f"{name} [{split}]",
        _local_candidates(name, split),
        HubSplit(HUB_REPO, split, config=name),
        data_dir,
        subdirs=("search",),
        fields_hint="rows with `question` and `golden_answers`",
    )
    items = [{**q, "source": name} for f in found.files for q in read_questions(f, errors)]
    return TaskSet(items, {**found.provenance(name, split, len(items)), **errors.record()})


def _paper(name: str, data_dir: str | None, errors: RowErrors) -> TaskSet:
    split, per_source = PAPER_SETS[name]
    found = locate(
        name,
        [f"nq_hotpotqa_train_{split}.parquet", f"nq_hotpotqa_train_{split}.jsonl"],
        HubSplit(PAPER_REPO, split),
        data_dir,
        subdirs=("search",),
        fields_hint="rows with `question`, `golden_answers`, `data_source`",
    )
    items = [{**q, "id": f"{q['source']}:{q['id']}"} for f in found.files for q in read_questions(f, errors)]
    if per_source is not None:
        items = _first_per_source(items, per_source)
    record = {**found.provenance(name, split, len(items)), **errors.record()}
    if per_source is not None:
        record["per_source"] = per_source
    return TaskSet(items, record)


def load_questions(
    dataset: str | None = None,
    split: str | None = None,
    data_dir: str | None = None,
    bad_rows: BadRows = "error",
    world: WorldKind = "classic",
    train_worlds: int = 4,
) -> TaskSet:
    """The question items of a dataset (cached), with their provenance.

    Args:
        dataset: None for the generated world; a JSONL/Parquet path; a known name (see `DEFAULT_SPLITS`)
            or one of the paper's sets (`PAPER_SETS`), looked up in `data_dir`, then $DRMAS_DATA_DIR,
            then the Hugging Face hub.
        split: for the classic world "train" (default), "test" or "all"; for the held-out worlds also
            "validation"; for a FlashRAG name the file's split (default: the split the paper evaluates on);
            ignored for a path and the paper's sets.
        data_dir: a local data directory.
        bad_rows: `drmas_envs.data.BadRows`: a malformed row stops the load ("error") or is skipped, counted
            in the provenance's `skipped_rows` and `first_skipped` ("skip").
        world: the generated world's kind (`drmas_envs.search.heldout.WorldKind`); only with `dataset=None`.
        train_worlds: `world="held-out"`: how many worlds the train split draws from.

    Raises:
        DatasetNotFoundError: a known name is neither local nor on a reachable hub.
        DataError: a malformed file (named by file and line/row).

    """
    where = None if data_dir is None else str(data_dir)
    if world != "classic" and dataset not in WORLD_NAMES:
        raise ValueError(f"world={world!r} is a generated world: it needs dataset=None, not {dataset!r}")
    return _load(dataset, split, where, os.environ.get(DATA_DIR_ENV), bad_rows, world, train_worlds)


def _world(split: str, world: WorldKind, train_worlds: int) -> TaskSet:
    if world == "held-out":
        keys = world_keys(split, train_worlds)
        items = heldout_questions(split, train_worlds)
        record = {"dataset": "world", "world": world, "split": split, "worlds": keys, "n": len(items)}
        return TaskSet(items, {**record, "origin": "generated"})
    if split not in ("train", "test", "all"):
        hint = " (world='held-out' has a validation split)" if split == "validation" else ""
        raise ValueError(f"the classic generated world has splits 'train', 'test' and 'all', not {split!r}{hint}")
    items = [q for q in generate_world().questions if split == "all" or q["split"] == split]
    return TaskSet(items, {"dataset": "world", "split": split, "n": len(items), "origin": "generated"})


@functools.lru_cache(maxsize=32)
def _load(
    dataset: str | None,
    split: str | None,
    data_dir: str | None,
    env_dir: str | None,
    bad_rows: BadRows,
    world: WorldKind,
    train_worlds: int,
) -> TaskSet:
    errors = RowErrors(bad_rows)
    if dataset in WORLD_NAMES:
        return _world(split or "train", world, train_worlds)
    if dataset in PAPER_SETS:
        return _paper(dataset, data_dir, errors)
    if dataset in DEFAULT_SPLITS:
        return _known(dataset, split or DEFAULT_SPLITS[dataset], data_dir, errors)
    path = Path(dataset).expanduser()
    if path.name.endswith((".jsonl", ".gz", ".parquet")) or path.exists():
        items = read_questions(path, errors)
        record = {"dataset": str(path), "n": len(items), "origin": "local", "files": [file_provenance(path)]}
        record.update(errors.record())
        return TaskSet(items, record)
    raise ValueError(
        f"unknown dataset {dataset!r}: give a JSONL/Parquet path or one of {sorted([*DEFAULT_SPLITS, *PAPER_SETS])}"
    )


def default_corpus(data_dir: str | None = None) -> Path | None:
    """A local Wikipedia corpus for the known datasets, if the data directory has one."""
    return find_local(CORPUS_CANDIDATES, data_dir)
