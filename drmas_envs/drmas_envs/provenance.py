"""Where a loaded dataset came from, as a small dict a trainer can write into its run's config.

Every loader of a dataset (`drmas_envs.math.datasets.load_tasks`, `drmas_envs.search.data.load_questions`,
the generated sets) returns a `TaskSet`: a tuple of items with a `provenance` dict, e.g.

    {"dataset": "math500", "split": "test", "n": 500, "origin": "local",
     "files": [{"path": "/data/math500.jsonl", "bytes": 421870, "sha256": "35dc41..."}]}
    {"dataset": "dapo_filter", "split": "train", "n": 17398, "origin": "hub",
     "repo": "aaabiao/dapo_filter", "revision": "<commit sha>", "hub_split": "train", "files": [...]}
    {"dataset": "math_test_sampled", "n": 110, "origin": "mix", "members": [{...}, ...]}

`dataset_provenance(env)` reads it back from a built env; `env_dataset(env_id, **kwargs)` loads what a
built-in env would train on without building the env (cheap, and early: before any model loads).
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


def env_dataset(env_id: str, **kwargs: Any) -> TaskSet | None:
    """The tasks a built-in env would load with these keyword arguments, without building the env.

    A trainer calls it for its train and eval envs before loading a model, so a missing dataset ends
    the run at once (`DatasetNotFoundError`), and writes `.provenance` into the run's config.

    Returns:
        The `TaskSet` (cached; its `provenance` says where it came from), or None for an env that is
        not one of the built-in math or search envs (its data is its own business).

    Raises:
        DatasetNotFoundError: a known dataset is neither local nor reachable (the message says how to fetch it).
        DataError: a malformed file (named by file and line/row).

    """
    from drmas_envs.registry import spec

    found = spec(env_id)
    options = {**found.kwargs, **kwargs}
    if found.entry_point == "drmas_envs.math.env:math_env":
        from drmas_envs.math.env import MathEnvConfig, env_tasks

        return env_tasks(MathEnvConfig(**options))
    if found.entry_point == "drmas_envs.search.env:search_env":
        from drmas_envs.search.data import load_questions

        return load_questions(options.get("dataset"), options.get("split"), options.get("data_dir"))
    return None
