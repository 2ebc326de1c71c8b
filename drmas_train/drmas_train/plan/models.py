"""What the plan knows of each model: its architecture, and its tokenizer when one is at hand (never its weights).

In order: a tiny test model or a local folder (its config.json and tokenizer); the default SmolLM2's
offline copy; the Hugging Face hub's config and tokenizer files (the local cache, then a download
unless offline); else the architecture numbers kept in `drmas_train.plan.arch` and no tokenizer.
A model's token statistics are computed only with its own tokenizer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drmas_train.config import DEFAULT_MODEL
from drmas_train.plan.arch import Arch, arch_from_folder, known_arch

log = logging.getLogger(__name__)

HUB_PATTERNS = ["*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
"""Files fetched from the hub: config and tokenizer only, no weights."""


@dataclass
class ModelInfo:
    """A model as the plan sees it."""

    name: str
    arch: Arch | None
    tokenizer: Any | None
    note: str
    """Where the architecture and tokenizer came from, or why there is none."""


def _tokenizer(folder: Path) -> Any | None:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        log.debug("no tokenizer in %s: %s", folder, exc)
        return None


def _from_folder(name: str, folder: Path, what: str) -> ModelInfo:
    tok = _tokenizer(folder)
    note = f"{what} {folder}" + ("" if tok is not None else " (no tokenizer there)")
    return ModelInfo(name, arch_from_folder(folder), tok, note)


def _hub_folder(name: str, offline: bool) -> Path | None:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    for local_only in (True,) if offline else (True, False):
        try:
            folder = Path(snapshot_download(name, local_files_only=local_only, allow_patterns=HUB_PATTERNS))
        except Exception as exc:  # offline, gated or unknown: the next way
            log.debug("hub files of %s (local_only=%s): %s", name, local_only, exc)
            continue
        if (folder / "config.json").is_file():
            return folder
    return None


def model_info(name: str, *, offline: bool) -> ModelInfo:
    """The architecture and tokenizer of model `name` (see the module docstring)."""
    from drmas_train.engines.resolve import TINY_NAMES, resolve_model

    if name in TINY_NAMES:
        return _from_folder(name, resolve_model(name), "tiny test model, built in")
    path = Path(name).expanduser()
    if path.is_dir():
        return _from_folder(name, path, "local folder")
    folder = _hub_folder(name, offline)
    if folder is not None:
        return _from_folder(name, folder, "Hugging Face files in")
    if name == DEFAULT_MODEL:
        try:
            return _from_folder(name, resolve_model(name), "offline copy")
        except (FileNotFoundError, ImportError) as exc:
            log.debug("no offline SmolLM2: %s", exc)
    arch = known_arch(name)
    where = "offline" if offline else "the hub is not reachable"
    if arch is None:
        return ModelInfo(name, None, None, f"unknown architecture ({where}, and {name!r} is not in the plan's table)")
    return ModelInfo(name, arch, None, f"architecture from the plan's table ({arch.source}); no tokenizer ({where})")
