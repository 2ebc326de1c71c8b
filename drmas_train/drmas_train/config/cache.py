"""Where converted and tiny models are kept on disk: $DRMAS_CACHE, else ~/.cache/drmas."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "DRMAS_CACHE"


def cache_dir() -> Path:
    """The model cache folder: $DRMAS_CACHE, else ~/.cache/drmas (not created here)."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "drmas"
    return Path(root)
