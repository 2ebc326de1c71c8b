"""FAISS indexes: load one as the reference does (`faiss.read_index`), or build a compressed IVF-PQ one.

Why IVF-PQ and not HNSW: an HNSW index keeps every full float32 vector plus its graph links, so for
wiki-18 it is larger than the 64 GB flat index it would replace. IVF-PQ stores one `m`-byte code per
passage (with `m = dim / 4`: 192 bytes for e5's 768 dims, 16x smaller than float32) and searches only
`nprobe` of `nlist` clusters. It is built from vectors streamed off disk: the clustering and the product
quantiser are trained on a sample, then the vectors are added in chunks, so memory stays at the codes
plus one chunk. Its recall against exact search is measured when it is built (`BuildReport`).

faiss is an optional extra (`pip install 'drmas-envs[faiss]'`), imported only here and only when used.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from drmas_envs.search.retrievers.faiss_lib import import_faiss
from drmas_envs.search.retrievers.rerank import search
from drmas_envs.search.retrievers.vectors import exact_top_k, recall_at_k

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class IVFPQConfig:
    """How the compressed index is built and searched (0 = chosen from the corpus size and dimension)."""

    nlist: int = 0
    """Coarse clusters; 0: sqrt(n) rounded to a power of two (1,024 at 1M passages, 4,096 at wiki-18's 21M)."""
    m: int = 0
    """Bytes per passage code (PQ sub-vectors); 0: dim / 4 (192 for e5, 96 for MiniLM): 16x smaller than float32."""
    nbits: int = 8
    """Bits per sub-vector code; 8 is FAISS's fast path. Tiny corpora get fewer (a code needs 2**nbits samples)."""
    nprobe: int = 32
    """Clusters searched per query: recall against speed (measured in benchmarks/results/retrieval_scale.md)."""
    train_size: int = 0
    """Vectors sampled to train the clustering and quantiser; 0: 64 per cluster, at least 16,384 (FAISS asks
    39 to 256 per cluster, and 39 x 256 for the 8-bit codes). Training time grows with it."""
    chunk: int = 65_536
    """Vectors added per step: build memory grows with this, not with the corpus."""
    recall_queries: int = 256
    """Queries for the build-time recall check against exact search."""
    seed: int = 0
    """Sampling seed (training sample and recall queries)."""
    min_passages: int = 10_000
    """Below this many passages an exact flat index is built: compression saves too little to cost recall."""
    shortlist: int = 0
    """Candidates per query the compressed index proposes for exact re-ranking from the float32 vectors
    memory-mapped off disk (`rerank.py`); 0: no re-ranking, the compressed scores decide."""


def _f(default: Any, help: str) -> Any:  # noqa: A002 - argparse's word
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class ServeConfig:
    """How a dense index folder is searched when loaded (each field is a `drmas-retrieval serve` flag)."""

    nprobe: int = _f(0, "IVF indexes: clusters searched per query (0: as built); more: higher recall, slower")
    shortlist: int = _f(0, "re-ranked indexes: candidates per query re-scored exactly from the vectors on disk "
                           "(0: as built); more: higher recall, more disk reads")  # fmt: skip
    gpus: tuple[int, ...] = _f((), "GPU ids (comma-separated) to shard a flat index over with faiss-gpu, one "
                                   "shard per GPU; empty: search on CPU")  # fmt: skip
    gpu_float32: bool = _f(False, "keep the vectors float32 on the GPUs (default float16, as the reference's "
                                  "server: half the GPU memory)")  # fmt: skip
    encoder_device: str = _f("cpu", "device of the query encoder: cpu, cuda or cuda:N (default cpu, so serving "
                                    "takes no training GPU)")  # fmt: skip

    def __post_init__(self) -> None:
        if self.nprobe < 0 or self.shortlist < 0:
            raise ValueError(f"nprobe and shortlist must be >= 0 (0: as built), got {self.nprobe}, {self.shortlist}")
        if len(set(self.gpus)) != len(self.gpus) or any(g < 0 for g in self.gpus):
            raise ValueError(f"gpus must name distinct GPU ids >= 0, got {self.gpus}")
        if self.gpus and (self.nprobe or self.shortlist):
            raise ValueError("gpus serves a flat (exact) index: nprobe and shortlist do not apply")


@dataclass(frozen=True)
class BuildReport:
    """What a compressed build measured: recall@k of the index against exact search on `queries` queries."""

    n: int
    nlist: int
    m: int
    nbits: int
    nprobe: int
    k: int
    recall: float
    queries: str
    shortlist: int = 0


def _shape(n: int, dim: int, cfg: IVFPQConfig) -> tuple[int, int, int]:
    auto = max(1, min(2 ** round(math.log2(max(1.0, math.sqrt(n)))), n // 39 or 1))  # FAISS: >= 39 per cluster
    nlist = max(1, min(cfg.nlist, n)) if cfg.nlist else auto
    m = cfg.m or max(1, dim // 4)
    while dim % m:  # PQ needs dim divisible by m
        m -= 1
    nbits = max(1, min(cfg.nbits, int(math.log2(max(2, min(n, _train_size(nlist, cfg)))))))
    return nlist, m, nbits


def _train_size(nlist: int, cfg: IVFPQConfig) -> int:
    return cfg.train_size or max(64 * nlist, 16_384)


def build_ivfpq(
    vectors: np.ndarray,
    cfg: IVFPQConfig | None = None,
    *,
    progress: Callable[[str, int, int | None], None] | None = None,
) -> Any:
    """An inner-product IVF-PQ index of `vectors` (n x dim float32, may be memory-mapped), built in chunks."""
    faiss = import_faiss()
    cfg = cfg or IVFPQConfig()
    n, dim = vectors.shape
    nlist, m, nbits = _shape(n, dim, cfg)
    rng = np.random.default_rng(cfg.seed)
    sample = np.sort(rng.choice(n, size=min(n, _train_size(nlist, cfg)), replace=False))
    train = np.ascontiguousarray(vectors[sample], dtype=np.float32)  # sorted: sequential reads of a memmap
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFPQ(quantizer, dim, nlist, m, nbits, faiss.METRIC_INNER_PRODUCT)
    logger.info("training IVF-PQ (nlist %d, m %d, nbits %d) on %d of %d vectors", nlist, m, nbits, len(train), n)
    if progress:
        progress("training", 0, None)
    index.train(train)
    del train
    for start in range(0, n, cfg.chunk):
        index.add(np.ascontiguousarray(vectors[start : start + cfg.chunk], dtype=np.float32))
        if progress:
            progress("adding", min(start + cfg.chunk, n), n)
    index.nprobe = min(cfg.nprobe, nlist)
    return index


def measure_recall(
    index: Any,
    vectors: np.ndarray,
    k: int = 3,
    queries: np.ndarray | None = None,
    cfg: IVFPQConfig | None = None,
    shortlist: int = 0,
) -> BuildReport:
    """Recall@k of `index` against exact search over `vectors`.

    Args:
        index: a FAISS index over `vectors`.
        vectors: the indexed vectors (exact search scans them in chunks).
        k: the cut-off (the paper retrieves 3).
        queries: query vectors (encoded questions); None: `cfg.recall_queries` indexed vectors sampled with
            noise added, so a passage is not trivially its own nearest neighbour.
        cfg: the build config (for the sample size, seed and the report).
        shortlist: a re-ranked index (`rerank.reranked`): candidates re-scored per query.

    """
    cfg = cfg or IVFPQConfig()
    kind = "encoded queries"
    if queries is None:
        rng = np.random.default_rng(cfg.seed + 1)
        pick = np.sort(rng.choice(len(vectors), size=min(len(vectors), cfg.recall_queries), replace=False))
        queries = np.asarray(vectors[pick], dtype=np.float32)
        queries = queries + rng.normal(scale=0.5 / math.sqrt(queries.shape[1]), size=queries.shape).astype(np.float32)
        queries /= np.linalg.norm(queries, axis=1, keepdims=True)
        kind = "indexed vectors plus noise"
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    _, exact = exact_top_k(queries, vectors, k)
    _, approx = search(index, queries, k, shortlist)
    ivf = _ivf(index)
    pq = getattr(ivf, "pq", None)
    shape = (ivf.nlist, pq.M if pq else 0, pq.nbits if pq else 0, ivf.nprobe) if ivf is not None else (0,) * 4
    recall = recall_at_k(approx, exact)
    return BuildReport(len(vectors), *shape, k=k, recall=recall, queries=f"{len(queries)} {kind}", shortlist=shortlist)


def _ivf(index: Any) -> Any:
    faiss = import_faiss()
    try:
        return faiss.downcast_index(faiss.extract_index_ivf(index))  # downcast: IndexIVFPQ, with its .pq
    except RuntimeError:  # not an IVF index (flat): nothing to report
        return None


def set_nprobe(index: Any, nprobe: int) -> None:
    """Set the clusters searched per query on an IVF index (no-op for other kinds)."""
    ivf = _ivf(index)
    if ivf is not None:
        ivf.nprobe = min(nprobe, ivf.nlist)
