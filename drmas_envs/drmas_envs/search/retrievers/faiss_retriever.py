"""Dense retrieval through a FAISS index: the reference's index file served as is, or a compressed IVF-PQ one.

An index folder of this kind holds `faiss/encoder.json` and either `faiss/index.faiss` (built here) or
`faiss/source.json` naming an existing FAISS file (e.g. the reference's e5_Flat.index, not copied), which
is loaded with `faiss.read_index` as the reference's server does.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from drmas_envs.search.retrievers.ann import (
    BuildReport,
    IVFPQConfig,
    build_ivfpq,
    import_faiss,
    measure_recall,
    set_nprobe,
)
from drmas_envs.search.retrievers.base import Passage
from drmas_envs.search.retrievers.dense import (
    SOURCE_FILE,
    EncoderSpec,
    check_count,
    encode_queries,
    encode_store,
    load_model,
    read_encoder,
    resolve_encoder,
    save_encoder,
)
from drmas_envs.search.retrievers.store import PassageStore
from drmas_envs.search.retrievers.vectors import load_vectors

logger = logging.getLogger(__name__)

INDEX_SUBDIR = "faiss"
INDEX_FILE = "index.faiss"
REPORT_FILE = "build_report.json"


class FaissRetriever:
    """Top-k by a FAISS inner-product index over unit vectors.

    Args:
        encoder: the encoder spec of the indexed vectors.
        index: a FAISS index (flat, IVF-PQ, ...), ids = passage positions in `store`.
        store: the passages.
        model: an already loaded SentenceTransformer (loaded from `encoder.model` if None).

    """

    def __init__(self, encoder: EncoderSpec, index: Any, store: PassageStore, model: Any = None):
        check_count(int(index.ntotal), store, "the FAISS index")
        self.encoder = encoder
        self.index = index
        self.store = store
        self.model = model if model is not None else load_model(encoder.model)

    @classmethod
    def build_on_disk(
        cls,
        store: PassageStore,
        directory: str | os.PathLike,
        *,
        encoder: str = "minilm",
        faiss_index: str | os.PathLike | None = None,
        vectors: str | os.PathLike | None = None,
        config: IVFPQConfig | None = None,
        recall_queries: list[str] | None = None,
        progress: Any = None,
    ) -> FaissRetriever:
        """Write `directory`/faiss and load it.

        Args:
            store: the passages, in vector order.
            directory: the index folder.
            encoder: the encoder of the vectors ("e5" for the reference's index).
            faiss_index: an existing FAISS file to serve as is (recorded, not copied or converted).
            vectors: vectors to compress (`.npy` or a flat FAISS file, streamed); None: encode the passages.
            config: the IVF-PQ build.
            recall_queries: questions whose encodings measure the build's recall; None: noisy passage vectors.
            progress: progress(stage, done, total).

        """
        out = Path(directory) / INDEX_SUBDIR
        spec = resolve_encoder(encoder)
        save_encoder(out, spec)
        if faiss_index is not None:
            (out / SOURCE_FILE).write_text(json.dumps({"index": str(Path(faiss_index).resolve())}))
            return cls.load(directory, store)
        model = None
        if vectors is None:
            model = load_model(spec.model)
            vecs = encode_store(model, spec, store, out / "vectors.npy", progress=progress)
        else:
            vecs = load_vectors(vectors)
        check_count(len(vecs), store, str(vectors or "the encoded vectors"))
        cfg = config or IVFPQConfig()
        if len(vecs) < cfg.min_passages:
            index = import_faiss().IndexFlatIP(vecs.shape[1])
            index.add(np.ascontiguousarray(vecs, dtype=np.float32))
            logger.info("%d passages: an exact flat FAISS index (compressed from %d)", len(vecs), cfg.min_passages)
        else:
            index = build_ivfpq(vecs, cfg, progress=progress)
        queries = None
        if recall_queries:
            model = model or load_model(spec.model)
            queries = encode_queries(model, spec, recall_queries)
        report = measure_recall(index, vecs, 3, queries, cfg)
        logger.info("FAISS index built: %s", report)
        (out / REPORT_FILE).write_text(json.dumps(asdict(report), indent=1))
        import_faiss().write_index(index, str(out / INDEX_FILE))
        return cls(spec, index, store, model)

    def save(self, directory: str | os.PathLike) -> None:
        """Nothing to do: `build_on_disk` wrote the folder."""

    @classmethod
    def load(cls, directory: str | os.PathLike, store: PassageStore, *, nprobe: int | None = None) -> FaissRetriever:
        """Read the folder's FAISS index (`faiss.read_index`, as the reference does) and its encoder."""
        faiss = import_faiss()
        src = Path(directory) / INDEX_SUBDIR
        spec = read_encoder(src)
        if (src / SOURCE_FILE).is_file():
            path = json.loads((src / SOURCE_FILE).read_text())["index"]
        else:
            path = str(src / INDEX_FILE)
        index = faiss.read_index(path)
        if nprobe is not None:
            set_nprobe(index, nprobe)
        return cls(spec, index, store)

    @staticmethod
    def report(directory: str | os.PathLike) -> BuildReport | None:
        """The build's recall report, if this folder's index was built here."""
        path = Path(directory) / INDEX_SUBDIR / REPORT_FILE
        return BuildReport(**json.loads(path.read_text())) if path.is_file() else None

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """One list of at most `k` passages per query, best first."""
        k = min(int(k), len(self.store))
        if not queries or k <= 0:
            return [[] for _ in queries]
        scores, ids = self.index.search(encode_queries(self.model, self.encoder, queries), k)
        return [
            [Passage(*self.store.get(int(i)), float(s)) for s, i in zip(row_s, row_i) if i >= 0]
            for row_s, row_i in zip(scores, ids)
        ]
