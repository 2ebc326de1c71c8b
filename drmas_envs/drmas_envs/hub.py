"""Known datasets: their local copies in a data directory, the Hugging Face hub, and the not-found error.

A known dataset is looked up, in order, as

1. a file under one of its flat names (`math500.jsonl`) in each data directory (`data_dirs`);
2. the hub repo's own layout in `<data dir>/<owner>/<name>/` or `<data dir>/<name>/` (what
   `hf download <owner>/<name> --repo-type dataset --local-dir <data dir>/<owner>/<name>` writes);
3. the hub itself (needs `huggingface_hub` and network; skipped while $HF_HUB_OFFLINE is set).

When none has it, `DatasetNotFoundError` names the dataset, each place looked, why the hub failed and
the command that fetches it once.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drmas_envs.data import DATA_DIR_ENV, HUB_OFFLINE_ENV, DatasetNotFoundError, data_dirs, hub_offline
from drmas_envs.provenance import file_provenance
from drmas_envs.tables import local_split_files, split_files


@dataclass(frozen=True)
class HubSplit:
    """One split of a hub dataset repo."""

    repo: str
    split: str
    config: str | None = None
    revision: str | None = None


@dataclass
class Located:
    """Where a known dataset's files were found: local paths, or hub downloads with their revision."""

    files: list[Path]
    origin: str  # "local" or "hub"
    hub: dict[str, Any] | None = None
    root: Path | None = None  # the local folder holding a downloaded repo, if that is where they were

    def provenance(self, dataset: str, split: str | None, n: int) -> dict[str, Any]:
        """The record a `TaskSet` carries: hub repo + revision, or local files + sha256.

        A local file of a downloaded repo also gets the revision `hf download --local-dir` noted beside it.
        """
        record: dict[str, Any] = {"dataset": dataset, "split": split, "n": n, "origin": self.origin}
        if self.origin == "hub":
            record.update(self.hub or {})
            return record
        record["files"] = [file_provenance(f) for f in self.files]
        for entry, path in zip(record["files"], self.files):
            revision = downloaded_revision(self.root, path) if self.root else None
            if revision:
                entry["revision"] = revision
        return record


def downloaded_revision(root: Path, path: Path) -> str | None:
    """The commit a file in `root` was downloaded at, from the metadata `hf download --local-dir` keeps."""
    meta = root / ".cache" / "huggingface" / "download" / f"{path.relative_to(root).as_posix()}.metadata"
    try:
        first = meta.read_text(encoding="utf-8").splitlines()[0].strip()
    except (OSError, IndexError):
        return None
    return first if len(first) == 40 and all(c in "0123456789abcdef" for c in first) else None


class HubUnavailable(Exception):
    """The hub could not give a split: the message says why (offline, no client, no network, no files)."""


def find_local_copy(
    flat_names: Sequence[str], hub: HubSplit | None, data_dir: str | os.PathLike | None, subdirs: Sequence[str] = ()
) -> tuple[Located | None, list[str]]:
    """The local files of a known dataset (None if there are none), and every place looked.

    Args:
        flat_names: file names tried in each data dir, also under each of `subdirs` ("math/").
        hub: the hub split whose repo layout is tried in `<dir>/<owner>/<name>/` and `<dir>/<name>/`.
        data_dir: the caller's data directory, searched before $DRMAS_DATA_DIR.
        subdirs: extra folders (relative to a data dir) that may hold the flat names.

    """
    looked: list[str] = []
    for root in data_dirs(data_dir):
        for rel in flat_names:
            for sub in ("", *subdirs):
                path = root / sub / rel
                looked.append(str(path))
                if path.is_file():
                    return Located([path], "local"), looked
        if hub is None:
            continue
        for folder in dict.fromkeys((root / hub.repo, root / hub.repo.split("/")[-1])):
            looked.append(f"{folder}/ ({hub.split!r} split files)")
            files = local_split_files(folder, hub.split, hub.config)
            if files:
                return Located(files, "local", root=folder), looked
    return None, looked


def fetch_split(hub: HubSplit) -> Located:
    """Download one split's files from the hub, pinned to the revision they came from.

    Raises:
        HubUnavailable: offline ($HF_HUB_OFFLINE), `huggingface_hub` missing, the hub unreachable, or
            the repo holding no file for the split.

    """
    if hub_offline():
        raise HubUnavailable(f"not tried: ${HUB_OFFLINE_ENV} is set")
    try:
        from huggingface_hub import HfApi, hf_hub_download
    except ImportError:
        raise HubUnavailable("not tried: `huggingface_hub` is not installed (pip install huggingface_hub)") from None
    try:
        info = HfApi().dataset_info(hub.repo, revision=hub.revision)
        names = [s.rfilename for s in info.siblings or ()]
        wanted = split_files(names, hub.split, hub.config)
        if not wanted:
            raise HubUnavailable(f"the repo has no {hub.split!r} split files (jsonl/json/parquet)")
        files = [Path(hf_hub_download(hub.repo, f, repo_type="dataset", revision=info.sha)) for f in wanted]
    except HubUnavailable:
        raise
    except Exception as exc:  # the client raises its own HTTP / connection / auth errors; all mean "not here"
        raise HubUnavailable(f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
    record = {"repo": hub.repo, "revision": info.sha, "hub_split": hub.split, "hub_files": wanted}
    if hub.config:
        record["config"] = hub.config
    return Located(files, "hub", record)


# Every make() resolves its dataset again; one download (and one revision lookup) per split and process.
# A failure is not cached, so a later call retries.
_fetch_cached = functools.lru_cache(maxsize=64)(fetch_split)


def locate(
    dataset: str,
    flat_names: Sequence[str],
    hub: HubSplit | None,
    data_dir: str | os.PathLike | None,
    subdirs: Sequence[str] = (),
    fields_hint: str = "",
) -> Located:
    """A known dataset's files: local first, then the hub; `DatasetNotFoundError` when neither has them.

    Args:
        dataset: the name (with its split), for the error message.
        flat_names: local file names (see `find_local_copy`).
        hub: the hub split, or None for a set that exists only as local files.
        data_dir: the caller's data directory.
        subdirs: extra folders that may hold the flat names.
        fields_hint: the fields a hand-made local file needs, for the error message.

    """
    local, looked = find_local_copy(flat_names, hub, data_dir, subdirs)
    if local is not None:
        return local
    reason = "there is no hub copy"
    if hub is not None:
        try:
            return _fetch_cached(hub)
        except HubUnavailable as exc:
            reason = f"{hub.repo} ({hub.split} split) {exc}"
    raise not_found(dataset, looked, reason, hub, flat_names, data_dir, fields_hint)


def not_found(
    dataset: str,
    looked: Sequence[str],
    hub_reason: str,
    hub: HubSplit | None,
    flat_names: Sequence[str],
    data_dir: str | os.PathLike | None,
    fields_hint: str = "",
) -> DatasetNotFoundError:
    """The one-line error for a dataset found nowhere: what, where looked, why not the hub, how to provide it."""
    dirs = data_dirs(data_dir)
    where = "; ".join(looked) if looked else f"no local data directory (pass data_dir= or set ${DATA_DIR_ENV})"
    target = str(dirs[0]) if dirs else "DATA_DIR"
    howto = []
    if hub is not None:
        howto.append(f"fetch it once with `hf download {hub.repo} --repo-type dataset --local-dir {target}/{hub.repo}`")
    fields = f" ({fields_hint})" if fields_hint else ""
    howto.append(f"or place {' or '.join(flat_names[:2])}{fields} in {target}")
    env_hint = "" if dirs else f", then pass data_dir={target} or set ${DATA_DIR_ENV}={target}"
    return DatasetNotFoundError(
        f"dataset {dataset!r} not found. Looked in: {where}. Hub: {hub_reason}. "
        f"To provide it: {' '.join(howto)}{env_hint} (see docs/paper_runs.md)."
    )
