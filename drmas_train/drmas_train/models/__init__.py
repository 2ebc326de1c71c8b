"""Models: resolving names to local folders, tiny test models, and agent-to-model assignment."""

from drmas_train.models.cache import cache_dir
from drmas_train.models.resolve import SMOLLM2_ID, resolve_model
from drmas_train.models.tiny import build_tiny_model

__all__ = ["SMOLLM2_ID", "build_tiny_model", "cache_dir", "resolve_model"]
