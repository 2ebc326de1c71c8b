"""Re-ranking: the compressed index proposes a shortlist, exact inner products over vectors on disk decide.

IVF-PQ scores are approximate: a passage's product-quantised code moves its score by more than the gap
between neighbouring passages, so its top 3 is often not the exact top 3. Re-ranking keeps the compressed
index for the search and re-scores its best `shortlist` candidates per query with the exact float32 inner
product (`faiss.IndexRefine`). The float32 vectors are a flat FAISS file in the layout of the reference's
`e5_Flat.index`, read with faiss's `IO_FLAG_MMAP_IFC | IO_FLAG_READ_ONLY`: memory-mapped, so they live in
the page cache (shared between processes, dropped under memory pressure) and anonymous memory stays
that of the compressed index. Each query reads `shortlist` vectors (`dim` x 4 bytes each) from the file.

An index folder built this way holds `faiss/refine.json`: {"vectors": the flat file, "shortlist": n}.
The flat file is the `--vectors` file itself when that is an inner-product flat FAISS file (not copied;
an absolute path), else a flat copy of the vectors written into the folder (a name relative to `faiss/`,
so the folder can be renamed or moved).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from drmas_envs.search.retrievers.faiss_lib import import_faiss, keep_alive
from drmas_envs.search.retrievers.vectors import flat_header, write_flat_index

REFINE_FILE = "refine.json"
FLAT_COPY = "vectors.flat.index"
"""The flat copy written into a folder whose vectors were not already a flat inner-product FAISS file."""
PAPER_K = 3
"""The top-k the build's recall report and the default k factor use (the paper retrieves 3)."""


def open_flat(path: str | os.PathLike) -> Any:
    """An IndexFlatIP whose vectors are memory-mapped from `path` (read only), not read into memory.

    Raises:
        ValueError: not a flat FAISS file, a truncated one, or an L2 one (the search is by inner product).
        ImportError: this faiss cannot memory-map a flat index's vectors (`IO_FLAG_MMAP_IFC`).

    """
    metric, _, _ = flat_header(path)
    if metric != "ip":
        raise ValueError(f"{path}: an L2 flat index; re-ranking inner-product search needs IndexFlatIP vectors")
    faiss = import_faiss()
    flag = getattr(faiss, "IO_FLAG_MMAP_IFC", None)
    if flag is None:
        raise ImportError(
            f"re-ranking memory-maps the vectors with IO_FLAG_MMAP_IFC, which faiss {faiss.__version__} lacks: "
            "pip install 'faiss-cpu>=1.11'"
        )
    return faiss.read_index(str(path), flag | faiss.IO_FLAG_READ_ONLY)


def refine_vectors(vectors: np.ndarray, source: str | os.PathLike | None, out: Path) -> Path:
    """The flat file to re-rank from: `source` when it is an inner-product flat FAISS file (used in place),
    else a flat copy of `vectors` written to `out`/FLAT_COPY, chunk by chunk.
    """
    if source is not None and Path(source).suffix != ".npy":
        try:
            if flat_header(source)[0] == "ip":
                return Path(source).resolve()
        except ValueError:
            pass
    return write_flat_index(vectors, out / FLAT_COPY).resolve()


def k_factor(k: int, shortlist: int) -> float:
    """IndexRefine's k factor for a shortlist of `shortlist` (at least `k`) candidates: faiss takes
    int(k * factor) candidates, so half a candidate is added against rounding down.
    """
    return (max(int(shortlist), k) + 0.5) / k


def reranked(base: Any, flat: Any, shortlist: int) -> Any:
    """`base`'s best `shortlist` candidates per query re-scored by `flat` (exact); k factor set for k = 3."""
    faiss = import_faiss()
    if base.ntotal != flat.ntotal or base.d != flat.d:
        raise ValueError(
            f"the re-ranking vectors hold {flat.ntotal} x {flat.d} but the index {base.ntotal} x {base.d}; "
            "they must match"
        )
    index = faiss.IndexRefine(base, flat)
    index.k_factor = k_factor(PAPER_K, shortlist)
    keep_alive(index, base, flat)
    return index


def search(index: Any, queries: np.ndarray, k: int, shortlist: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) of `index`; a re-ranked index (shortlist > 0) takes `shortlist` candidates at this k."""
    if not shortlist:
        return index.search(queries, k)
    params = import_faiss().IndexRefineSearchParameters(k_factor=k_factor(k, shortlist))
    return index.search(queries, k, params=params)


def write_refine(directory: Path, vectors: Path, shortlist: int) -> None:
    """Record the re-ranking of an index folder's `faiss/` (a flat file inside it by its relative name)."""
    inside = vectors.parent == directory.resolve()
    record = {"vectors": vectors.name if inside else str(vectors), "shortlist": int(shortlist)}
    (directory / REFINE_FILE).write_text(json.dumps(record))


def read_refine(directory: Path) -> dict | None:
    """The folder's re-ranking record, its vectors path made absolute; None when its index is not re-ranked."""
    path = directory / REFINE_FILE
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    record["vectors"] = str(directory.resolve() / record["vectors"])  # an absolute path stays as it is
    return record
