"""Where a loaded dataset came from, as a small dict a trainer can write into its run's config.

Every loader of a dataset (`drmas_envs.math.datasets.load_tasks`, `drmas_envs.search.data.load_questions`,
the generated sets) returns a `TaskSet`: a tuple of items with a `provenance` dict, e.g.

    {"dataset": "math500", "split": "test", "n": 500, "origin": "local",
     "files": [{"path": "/data/math500.jsonl", "bytes": 421870, "sha256": "35dc41..."}]}
    {"dataset": "dapo_filter", "split": "train", "n": 17398, "origin": "hub",
     "repo": "aaabiao/dapo_filter", "revision": "<commit sha>", "hub_split": "train", "files": [...]}
    {"dataset": "math_test_sampled", "n": 110, "origin": "mix", "members": [{...}, ...]}

`dataset_provenance(env)` reads it back from a built env; `drmas_envs.registry.env_dataset(env_id, **kwargs)`
loads what a built-in env would train on without building the env (cheap, and early: before any model loads).
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class TaskSet(tuple):
    """A dataset's items (a tuple, so every tuple use still works) and where they came from."""

    provenance: dict[str, Any]

    def __new__(cls, items: Iterable[Any] = (), provenance: dict[str, Any] | None = None) -> TaskSet:
        obj = super().__new__(cls, items)
        obj.provenance = dict(provenance or {})
        return obj

    def __getnewargs__(self) -> tuple[Any, ...]:  # keeps the provenance through pickling
        return tuple(self), self.provenance


@functools.lru_cache(maxsize=128)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_provenance(path: str | os.PathLike) -> dict[str, Any]:
    """A local file's absolute path, size and sha256 (hashed once per file version)."""
    p = Path(path).resolve()
    st = p.stat()
    return {"path": str(p), "bytes": st.st_size, "sha256": _sha256(str(p), st.st_size, st.st_mtime_ns)}


def dataset_provenance(env: Any) -> dict[str, Any]:
    """Where a built env's tasks came from (`{}` for an env built from a plain task list).

    Args:
        env: an env from `drmas_envs.make` (wrapped or not), or a `TaskSet`.

    """
    if isinstance(env, TaskSet):
        return dict(env.provenance)
    return dict(getattr(getattr(env, "unwrapped", env), "data_provenance", None) or {})


def reference_check(env: Any) -> dict[str, Any] | None:
    """Every distinct reference answer of a built env's tasks that its grader must parse, parsed once:
    {"checked", "failed", "failures": [{"reference", "reason"}, ...]} (`Grader.check_references`), or None
    for an env whose workflow cannot check its references (no grader, or a plain grading callable).

    A trainer records it beside the dataset's provenance at start, so a reference the grader cannot read is
    known before the first step, not found as a run of wrong answers.
    """
    unwrapped = getattr(env, "unwrapped", env)
    check = getattr(getattr(unwrapped, "_factory", None), "check_references", None)
    tasks = getattr(unwrapped, "tasks", None)
    return check(tasks) if callable(check) and tasks is not None else None
