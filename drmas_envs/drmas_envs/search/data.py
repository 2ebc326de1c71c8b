"""Question sets and corpora for the search envs: JSONL files, known names, or the generated world.

Loaded sets are cached (`make()` is called for every episode batch), so repeated loads are free.
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any

from drmas_envs.data import DataError, find_local, iter_jsonl
from drmas_envs.search.world import generate_world

logger = logging.getLogger(__name__)

HUB_REPO = "RUC-NLPIR/FlashRAG_datasets"
"""The Hugging Face dataset repo used by Search-R1 and FlashRAG: `<name>/<split>.jsonl` files."""

DEFAULT_SPLITS = {
    "nq": "test",
    "triviaqa": "test",
    "popqa": "test",
    "hotpotqa": "dev",
    "2wikimultihopqa": "dev",
    "musique": "dev",
    "bamboogle": "test",
}
"""The known dataset names and the split the paper evaluates on."""

WORLD_NAMES = (None, "", "default", "world")
CORPUS_CANDIDATES = ("corpus/wiki_passages.jsonl.gz", "wiki_passages.jsonl.gz", "corpus/wiki-18.jsonl", "wiki-18.jsonl")
"""Where a local data directory may hold the corpus used with the known (Wikipedia) datasets."""


def _answers(item: dict[str, Any], where: str) -> list[str]:
    gold = item.get("golden_answers")
    if isinstance(gold, str):
        gold = [gold]
    if not isinstance(gold, list) or not gold or not all(isinstance(g, (str, int, float)) for g in gold):
        raise DataError(f"{where}: `golden_answers` must be a non-empty list of strings")
    return [str(g) for g in gold]


def read_questions(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Questions from a JSONL file with `question`, `golden_answers`, optional `id` and `source`.

    `source` defaults to the file's stem; `evaluate` reports per source.

    Raises:
        DataError: a malformed line (named by file and line).

    """
    path = Path(path)
    items = []
    for i, item in enumerate(iter_jsonl(path, required=("question", "golden_answers"))):
        where = f"{path}: item {i + 1}"
        if not isinstance(item["question"], str) or not item["question"].strip():
            raise DataError(f"{where}: `question` must be a non-empty string")
        items.append(
            {
                "id": str(item.get("id", f"{path.stem}-{i}")),
                "question": item["question"].strip(),
                "golden_answers": _answers(item, where),
                "source": str(item.get("source") or path.stem),
            }
        )
    if not items:
        raise DataError(f"{path}: no questions")
    return items


def _local_candidates(name: str, split: str) -> list[str]:
    return [
        f"search/{name}_{split}.jsonl",
        f"{name}_{split}.jsonl",
        f"{name}/{split}.jsonl",
        f"search/{name}/{split}.jsonl",
    ]


def _from_hub(name: str, split: str) -> Path:  # pragma: no cover - needs network
    """Download `<name>/<split>.jsonl` from the FlashRAG hub repo (needs network and huggingface_hub)."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as exc:
        raise ImportError(f"dataset {name!r} is not local; downloading it needs `pip install huggingface_hub`") from exc
    return Path(hf_hub_download(HUB_REPO, f"{name}/{split}.jsonl", repo_type="dataset"))


@functools.lru_cache(maxsize=32)
def load_questions(
    dataset: str | None = None, split: str | None = None, data_dir: str | None = None
) -> tuple[dict, ...]:
    """The question items of a dataset (cached).

    Args:
        dataset: None for the generated world; a JSONL path; or a known name (see `DEFAULT_SPLITS`),
            looked up in `data_dir`, then $DRMAS_DATA_DIR, then the Hugging Face hub.
        split: for the world "train" (default) or "test"; for a known name the file's split
            (default: the split the paper evaluates on); ignored for a path.
        data_dir: a local data directory.

    """
    if dataset in WORLD_NAMES:
        split = split or "train"
        if split not in ("train", "test", "all"):
            raise ValueError(f"the generated world has splits 'train', 'test' and 'all', not {split!r}")
        return tuple(q for q in generate_world().questions if split == "all" or q["split"] == split)
    if dataset in DEFAULT_SPLITS:
        split = split or DEFAULT_SPLITS[dataset]
        path = find_local(_local_candidates(dataset, split), data_dir)
        if path is None:
            logger.info("%s/%s not found locally; trying the hub (%s)", dataset, split, HUB_REPO)
            path = _from_hub(dataset, split)
        return tuple({**q, "source": dataset} for q in read_questions(path))
    path = Path(dataset)
    if path.suffix in (".jsonl", ".gz") or path.exists():
        return tuple(read_questions(path))
    raise ValueError(f"unknown dataset {dataset!r}: give a JSONL path or one of {sorted(DEFAULT_SPLITS)}")


def default_corpus(data_dir: str | None = None) -> Path | None:
    """A local Wikipedia corpus for the known datasets, if the data directory has one."""
    return find_local(CORPUS_CANDIDATES, data_dir)
