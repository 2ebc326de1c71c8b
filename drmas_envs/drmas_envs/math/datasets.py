"""Math datasets: files (JSONL or Parquet), known names (local data directory first, then the hub), mixes.

Every item becomes a dict with at least `id`, `problem`, `answer` (a non-empty string) and `source`;
other fields are kept. Loads are cached per file (path, size, mtime), so the hundreds of `make()`
calls of an evaluation or a training run read each file once. Every load returns a `TaskSet` whose
`provenance` says which files (path, sha256) or hub revision the items came from. The known names
and the paper's mixes are listed in `drmas_envs.math.known`.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from drmas_envs.data import BadRows, DataError, DatasetNotFoundError, RowErrors
from drmas_envs.hub import locate
from drmas_envs.math.answers import last_boxed
from drmas_envs.math.known import KNOWN, MIXES, HubSource, KnownDataset, Member
from drmas_envs.provenance import TaskSet, file_provenance
from drmas_envs.tables import iter_rows

logger = logging.getLogger(__name__)

Task = dict[str, Any]

__all__ = [
    "KNOWN",
    "MIXES",
    "HubSource",
    "KnownDataset",
    "Member",
    "load_jsonl_tasks",
    "load_tasks",
    "looks_like_path",
    "normalise_item",
]

# The instruction DAPO-style chat prompts end with; our prompts give their own, as the reference's
# preprocessing strips it from `aaabiao/dapo_filter` too.
_BOXED_SUFFIX = re.compile(
    r"(\r?\n|\\n)*\s*Let'?s\s+think\s+step\s+by\s+step\s+and\s+output\s+the\s+final\s+answer"
    r"\s+within\s*\\boxed\{\}\.\s*$",
    re.IGNORECASE,
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


def _get(item: Mapping[str, Any], key: str) -> Any:
    """`item[key]`, where a dotted key walks nested mappings; `_MISSING` when absent."""
    value: Any = item
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


_MISSING = object()

PATH_FIELDS = HubSource(
    "",
    "",
    ("problem", "env_kwargs.question", "extra_info.question", "prompt"),
    ("answer", "env_kwargs.ground_truth", "reward_model.ground_truth", "extra_info.answer"),
)
"""The fields of a file given by path: ours (`problem`, `answer`), else those of the files the reference's
preprocessing writes (`examples/data_preprocess/drmas_math.py`: `train`, `test_sampled`, `test` parquet),
whose `data_source` tags each row's source."""


def _pick(item: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[str, Any] | None:
    for k in keys:
        value = _get(item, k)
        if value is not _MISSING:
            return k, value
    return None


def _problem_text(value: Any) -> str | None:
    """A problem as text: a string, or the user turn of chat messages (its boxed-answer instruction cut)."""
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, list) and value and all(isinstance(m, Mapping) for m in value):
        users = [m.get("content") for m in value if m.get("role", "user") == "user"]
        if users and isinstance(users[-1], str) and users[-1].strip():
            return _BOXED_SUFFIX.sub("", users[-1])
    return None


def normalise_item(item: Mapping[str, Any], where: str, source: str, index: int, hub: HubSource | None = None) -> Task:
    """One dataset item as a task dict; `where` ("file:line") names it in errors."""
    problem_keys = hub.problem_keys if hub else ("problem",)
    answer_keys = hub.answer_keys if hub else ("answer",)
    picked_p, picked_a = _pick(item, problem_keys), _pick(item, answer_keys)
    problem = _problem_text(picked_p[1]) if picked_p else None
    if problem is None:
        raise DataError(f"{where}: `{'|'.join(problem_keys)}` must be a non-empty string (or chat messages)")
    answer = _answer_text(picked_a[1], picked_a[0].rsplit(".", 1)[-1]) if picked_a else None
    if not answer:
        raise DataError(f"{where}: `{'|'.join(answer_keys)}` must be a non-empty string, number or list")
    task = {k: v for k, v in item.items() if isinstance(k, str)}
    task.update(problem=problem, answer=answer)
    task["id"] = str(item.get("id", f"{source}-{index}"))
    task["source"] = str(item.get("source") or source)
    return task


@functools.lru_cache(maxsize=64)
def _load_file(
    path: str, size: int, mtime_ns: int, source: str, hub: HubSource | None, bad_rows: BadRows
) -> tuple[tuple[Task, ...], dict[str, Any]]:
    tasks, errors = [], RowErrors(bad_rows)
    for i, (where, item) in enumerate(iter_rows(path, on_error=errors)):
        try:
            if hub is None:
                names = {"problem": PATH_FIELDS.problem_keys, "answer": PATH_FIELDS.answer_keys}
                missing = [f for f, keys in names.items() if _pick(item, keys) is None]
                if missing:
                    alternates = [k for f in missing for k in names[f][1:]]
                    raise DataError(f"{where}: missing field(s) {missing} (or the reference layout's {alternates})")
            task = normalise_item(item, where, source, i, hub or PATH_FIELDS)
            if hub is None and item.get("data_source") and not item.get("source"):
                task["source"] = str(item["data_source"])  # the reference's per-source tag (a file by path)
            tasks.append(task)
        except DataError as exc:
            errors(exc)
    if errors.count:
        logger.warning("%s: skipped %d malformed row(s), first: %s", path, errors.count, "; ".join(errors.first))
    return tuple(tasks), errors.record()


def _file_tasks(
    path: Path, source: str | None = None, hub: HubSource | None = None, bad_rows: BadRows = "error"
) -> tuple[tuple[Task, ...], dict[str, Any]]:
    """A file's tasks and the record of the rows it skipped (empty unless `bad_rows` is "skip")."""
    p = path.expanduser().resolve()
    if not p.is_file():
        raise FileNotFoundError(f"dataset file not found: {p}")
    st = p.stat()
    tasks, skipped = _load_file(str(p), st.st_size, st.st_mtime_ns, source or p.name.split(".")[0], hub, bad_rows)
    if not tasks:
        raise DataError(f"{p}: no items")
    return tasks, skipped


def load_jsonl_tasks(path: str | os.PathLike, bad_rows: BadRows = "error") -> TaskSet:
    """The tasks of a JSONL or Parquet file (fields `problem`, `answer`, optional `id`, `source`, or the
    reference's preprocessed layout: `PATH_FIELDS`), cached; `bad_rows` as `drmas_envs.data.BadRows`.

    Raises:
        DataError: a malformed line or row, named by path and line/row number.
        FileNotFoundError: no such file.

    """
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise FileNotFoundError(f"dataset file not found: {p}")
    st = p.stat()
    return _path_taskset(str(p), st.st_size, st.st_mtime_ns, bad_rows)


@functools.lru_cache(maxsize=64)
def _path_taskset(path: str, size: int, mtime_ns: int, bad_rows: BadRows) -> TaskSet:
    tasks, skipped = _file_tasks(Path(path), bad_rows=bad_rows)
    record = {"dataset": path, "n": len(tasks), "origin": "local", "files": [file_provenance(path)], **skipped}
    return TaskSet(tasks, record)


def looks_like_path(dataset: str) -> bool:
    """Whether `dataset` names a file rather than a known dataset."""
    return (
        dataset.endswith((".jsonl", ".jsonl.gz", ".json", ".parquet")) or os.sep in dataset or Path(dataset).is_file()
    )


def load_tasks(
    dataset: str, split: str | None = None, data_dir: str | os.PathLike | None = None, bad_rows: BadRows = "error"
) -> TaskSet:
    """Resolve `dataset` (a file path, a known name or a mix) and `split` to its tasks.

    `bad_rows` (`drmas_envs.data.BadRows`): a malformed row stops the load ("error") or is skipped, counted
    and named in the provenance's `skipped_rows` / `first_skipped` ("skip").

    Known names are looked up in `data_dir`, then $DRMAS_DATA_DIR (as `<dir>/<file>`, `<dir>/math/<file>`,
    or the hub repo's layout in `<dir>/<owner>/<name>/`), then on the Hugging Face hub.

    Raises:
        DatasetNotFoundError: a known name is neither local nor on a reachable hub (the message says how
            to fetch it once).
        DataError: a malformed file, named by path and line/row.
        ValueError: an unknown name or split.

    """
    if looks_like_path(dataset):
        if split not in (None, "", "test", "train"):
            logger.info("split %r ignored for the file %s", split, dataset)
        return load_jsonl_tasks(dataset, bad_rows)
    name = dataset.lower().replace("-", "_")
    if name in MIXES:
        return load_mix(name, split, data_dir, bad_rows)
    if name not in KNOWN:
        raise ValueError(
            f"unknown math dataset {dataset!r}: give a JSONL/Parquet path or one of {sorted([*KNOWN, *MIXES])}"
        )
    known = KNOWN[name]
    split = split or known.default_split
    if split not in known.files:
        raise ValueError(f"dataset {dataset!r} has no split {split!r}; splits: {sorted(known.files)}")
    hub = known.hub.get(split)
    found = locate(
        f"{name} [{split}]",
        known.files[split],
        hub.hub_split if hub else None,
        data_dir,
        subdirs=("math",),
        fields_hint="rows with `problem` and `answer`",
    )
    parts = [_file_tasks(f, name, _fields(hub), bad_rows) for f in found.files]
    tasks = tuple(t for part, _ in parts for t in part)
    skipped = [s for _, s in parts if s]
    record = found.provenance(name, split, len(tasks))
    if skipped:
        record["skipped_rows"] = sum(s["skipped_rows"] for s in skipped)
        record["first_skipped"] = [w for s in skipped for w in s["first_skipped"]][: RowErrors.KEEP]
    return TaskSet(tasks, record)


def _fields(hub: HubSource | None) -> HubSource:
    """Field names for a known name's files: ours (`problem`, `answer`) first, then the hub copy's."""
    hub = hub or HubSource("", "")
    return HubSource(
        hub.repo,
        hub.split,
        tuple(dict.fromkeys(("problem", *hub.problem_keys))),
        tuple(dict.fromkeys(("answer", *hub.answer_keys))),
    )


def load_mix(
    name: str, split: str | None = None, data_dir: str | os.PathLike | None = None, bad_rows: BadRows = "error"
) -> TaskSet:
    """One of `MIXES`: its members resolved like known names, each item tagged with its member's `source`.

    Raises:
        DatasetNotFoundError: one error listing every member that was not found.
        DataError: a member has fewer items than the mix takes from it.

    """
    if split not in (None, "", "test"):
        raise ValueError(f"dataset {name!r} is a test mix; it has no split {split!r}")
    members, missing = [], []
    for m in MIXES[name]:
        try:
            members.append((m, load_tasks(m.dataset, None, data_dir, bad_rows)))
        except DatasetNotFoundError as exc:
            missing.append(str(exc))
    if missing:
        names = ", ".join(m.dataset for m in MIXES[name])
        raise DatasetNotFoundError(
            f"dataset {name!r} (a mix of {names}): {len(missing)} member(s) missing: " + " | ".join(missing)
        )
    tasks, record = [], {"dataset": name, "split": "test", "origin": "mix", "members": []}
    for m, part in members:
        if m.take is not None and len(part) < m.take:
            raise DataError(f"{name}: member {m.dataset} has {len(part)} items, fewer than the {m.take} it takes")
        chosen = part[: m.take] if m.take is not None else part
        tasks.extend({**t, "source": m.source, "id": f"{m.source}:{t['id']}"} for t in chosen)
        record["members"].append({"source": m.source, "take": len(chosen), **part.provenance})
    record["n"] = len(tasks)
    return TaskSet(tasks, record)
