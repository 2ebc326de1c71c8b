"""Dense retrieval through a FAISS index: the reference's index file served as is, or a compressed IVF-PQ one.

An index folder of this kind holds `faiss/encoder.json` and either `faiss/index.faiss` (built here) or
`faiss/source.json` naming an existing FAISS file (e.g. the reference's e5_Flat.index, not copied), which
is loaded with `faiss.read_index` as the reference's server does, or, with `ServeConfig.gpus`, sharded
over GPUs (`gpu.py`). A compressed index built with a shortlist also holds `faiss/refine.json`: its
candidates are re-ranked exactly from float32 vectors memory-mapped off disk (`rerank.py`).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from drmas_envs.search.retrievers import rerank
from drmas_envs.search.retrievers.ann import (
    BuildReport,
    IVFPQConfig,
    ServeConfig,
    build_ivfpq,
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
from drmas_envs.search.retrievers.faiss_lib import import_faiss
from drmas_envs.search.retrievers.store import PassageStore
from drmas_envs.search.retrievers.vectors import flat_header, load_vectors, read_flat_index

logger = logging.getLogger(__name__)

INDEX_SUBDIR = "faiss"
INDEX_FILE = "index.faiss"
REPORT_FILE = "build_report.json"


class FaissRetriever:
    """Top-k by a FAISS inner-product index over unit vectors.

    Args:
        encoder: the encoder spec of the indexed vectors.
        index: a FAISS index (flat, IVF-PQ, re-ranked, sharded...), ids = passage positions in `store`.
        store: the passages.
        model: an already loaded SentenceTransformer (loaded from `encoder.model` if None).
        shortlist: a re-ranked index: candidates per query re-scored exactly (0: `index` is not re-ranked).
        device: where a model loaded here runs ("cpu", "cuda:N").

    """

    def __init__(
        self,
        encoder: EncoderSpec,
        index: Any,
        store: PassageStore,
        model: Any = None,
        *,
        shortlist: int = 0,
        device: str = "cpu",
    ):
        check_count(int(index.ntotal), store, "the FAISS index")
        self.encoder = encoder
        self.index = index
        self.store = store
        self.shortlist = shortlist
        self.model = model if model is not None else load_model(encoder.model, device)

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
            config: the IVF-PQ build (`config.shortlist`: re-ranked from the vectors, as a flat file).
            recall_queries: questions whose encodings measure the build's recall; None: noisy passage vectors.
            progress: progress(stage, done, total).

        """
        out = Path(directory) / INDEX_SUBDIR
        spec = resolve_encoder(encoder)
        save_encoder(out, spec)
        if faiss_index is not None:
            (out / SOURCE_FILE).write_text(json.dumps({"index": str(Path(faiss_index).resolve())}))
            return cls(spec, _read_mapped(str(faiss_index)), store)
        model = None
        if vectors is None:
            model = load_model(spec.model)
            vecs = encode_store(model, spec, store, out / "vectors.npy", progress=progress)
        else:
            vecs = load_vectors(vectors)
        check_count(len(vecs), store, str(vectors or "the encoded vectors"))
        cfg = config or IVFPQConfig()
        shortlist = 0
        if len(vecs) < cfg.min_passages:
            index = import_faiss().IndexFlatIP(vecs.shape[1])
            index.add(np.ascontiguousarray(vecs, dtype=np.float32))
            logger.info("%d passages: an exact flat FAISS index (compressed from %d)", len(vecs), cfg.min_passages)
        else:
            index = build_ivfpq(vecs, cfg, progress=progress)
        import_faiss().write_index(index, str(out / INDEX_FILE))
        if cfg.shortlist and len(vecs) >= cfg.min_passages:
            flat = rerank.refine_vectors(vecs, vectors, out)
            rerank.write_refine(out, flat, cfg.shortlist)
            index, shortlist = rerank.reranked(index, rerank.open_flat(flat), cfg.shortlist), cfg.shortlist
        queries = None
        if recall_queries:
            model = model or load_model(spec.model)
            queries = encode_queries(model, spec, recall_queries)
        report = measure_recall(index, vecs, 3, queries, cfg, shortlist=shortlist)
        logger.info("FAISS index built: %s", report)
        (out / REPORT_FILE).write_text(json.dumps(asdict(report), indent=1))
        return cls(spec, index, store, model, shortlist=shortlist)

    def save(self, directory: str | os.PathLike) -> None:
        """Nothing to do: `build_on_disk` wrote the folder."""

    @classmethod
    def load(
        cls, directory: str | os.PathLike, store: PassageStore, serve: ServeConfig | None = None
    ) -> FaissRetriever:
        """Read the folder's FAISS index (`faiss.read_index`, as the reference does) and its encoder.

        Raises:
            ValueError: `serve` asks for what the folder's index is not (a shortlist of an index that is not
                re-ranked, GPUs for one that is not flat), or for GPUs this faiss does not have.

        """
        faiss = import_faiss()
        serve = serve or ServeConfig()
        src = Path(directory) / INDEX_SUBDIR
        spec = read_encoder(src)
        if (src / SOURCE_FILE).is_file():
            path = json.loads((src / SOURCE_FILE).read_text())["index"]
        else:
            path = str(src / INDEX_FILE)
        if serve.gpus:
            return cls(spec, _on_gpus(path, serve), store, device=serve.encoder_device)
        index = faiss.read_index(path)
        if serve.nprobe:
            set_nprobe(index, serve.nprobe)
        refine, shortlist = rerank.read_refine(src), 0
        if refine is not None:
            shortlist = serve.shortlist or int(refine["shortlist"])
            index = rerank.reranked(index, rerank.open_flat(refine["vectors"]), shortlist)
        elif serve.shortlist:
            raise ValueError(f"{directory}: its index is not re-ranked; a shortlist needs one built with --shortlist")
        return cls(spec, index, store, shortlist=shortlist, device=serve.encoder_device)

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
        scores, ids = rerank.search(self.index, encode_queries(self.model, self.encoder, queries), k, self.shortlist)
        return [
            [Passage(*self.store.get(int(i)), float(s)) for s, i in zip(row_s, row_i) if i >= 0]
            for row_s, row_i in zip(scores, ids)
        ]


def _read_mapped(path: str) -> Any:
    """A FAISS file for a build's checks: a flat one memory-mapped (the reference's file is not read into
    memory to be counted), any other kind read whole.
    """
    faiss = import_faiss()
    flag = getattr(faiss, "IO_FLAG_MMAP_IFC", None)
    try:
        flat_header(path)
    except ValueError:
        flag = None
    return faiss.read_index(path, flag | faiss.IO_FLAG_READ_ONLY) if flag else faiss.read_index(path)


def _on_gpus(path: str, serve: ServeConfig) -> Any:
    """The flat FAISS file at `path` sharded over `serve.gpus`, its vectors streamed from a memory map."""
    from drmas_envs.search.retrievers.gpu import check_gpus, gpu_flat

    check_gpus(import_faiss(), serve.gpus)  # before the file is read
    try:
        metric = flat_header(path)[0]
    except ValueError:
        metric = None
    if metric != "ip":
        raise ValueError(
            f"--gpus serves a flat inner-product FAISS file (the reference's e5_Flat.index, --faiss-index); {path} "
            "is not one"
        )
    return gpu_flat(read_flat_index(path), serve.gpus, float16=not serve.gpu_float32)
