"""The faiss module behind one clear error, and faiss's way of keeping sub-indexes alive: what every
FAISS-backed retriever module (`ann`, `rerank`, `gpu`) shares.
"""

from __future__ import annotations

from typing import Any

FAISS_EXTRA = "pip install 'drmas-envs[faiss]'"


def import_faiss() -> Any:
    """The faiss module, or one clear error naming the extra to install."""
    try:
        import faiss
    except ImportError:
        raise ImportError(f"FAISS indexes need the faiss extra (faiss-cpu is not installed): {FAISS_EXTRA}") from None
    return faiss


def keep_alive(index: Any, *objects: Any) -> None:
    """Tie `objects` (sub-indexes, GPU resources) to `index`'s lifetime, in faiss's own `referenced_objects`
    (faiss wrappers do not own what they are built from; recent versions record some of it themselves).
    """
    index.referenced_objects = [*(getattr(index, "referenced_objects", None) or []), *objects]
