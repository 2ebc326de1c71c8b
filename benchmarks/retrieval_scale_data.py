"""The corpus and vectors of benchmarks/retrieval_scale.py: real passages plus filler, embedded with MiniLM.

Text: the real passages of ../shared/data/corpus/wiki_passages.jsonl.gz (read by path, never copied),
then filler passages up to `n`, each three sentences drawn at random (seed 0) from a pool of real
sentences, titled with the first sentence's article and a number. Vectors (all-MiniLM-L6-v2, 384 dims,
unit length, inputs cut at `MAX_TOKENS` word pieces because full passages embed at ~13/s on the shared
2-core CPU):
- a real passage: the encoder's embedding of "title. text" (first `MAX_TOKENS` word pieces);
- a filler passage: the normalised mean of the encoder's embeddings of its three pool sentences. This is
  *not* the encoder's embedding of the filler text (1M encoder passes do not fit the time here); it keeps
  the vectors' distribution made of real MiniLM outputs, which is what index build, memory, speed and
  compressed-vs-exact recall depend on.

Everything is cached under the work folder, so the benchmark can be rerun without re-embedding.

    python benchmarks/retrieval_scale_data.py --work /tmp/drmas-retrieval-scale --n 1000000
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("DRMAS_DATA_DIR") or ROOT.parent / "shared" / "data")
REAL_CORPUS = DATA / "corpus" / "wiki_passages.jsonl.gz"
POOL_SIZE = 16_384
MAX_TOKENS = 32
SENTENCES_PER_FILLER = 3
CHUNK = 2048
log = logging.getLogger("retrieval_scale")
_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def _real_records() -> list[tuple[str, str, str]]:
    from drmas_envs.search.retrievers import iter_corpus

    return list(iter_corpus(REAL_CORPUS))


def sentence_pool(real: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """POOL_SIZE (title, sentence) pairs drawn (seed 0) from the real passages' sentences of 40-200 chars."""
    pairs = [(title, s) for _, title, text in real for s in _SPLIT.split(text) if 40 <= len(s) <= 200]
    rng = np.random.default_rng(0)
    pick = rng.choice(len(pairs), size=min(POOL_SIZE, len(pairs)), replace=False)
    return [pairs[i] for i in sorted(pick)]


def filler_choice(n_filler: int, pool: int) -> np.ndarray:
    """(n_filler, 3) pool indices of each filler passage's sentences (seed 1)."""
    return np.random.default_rng(1).integers(0, pool, size=(n_filler, SENTENCES_PER_FILLER), dtype=np.int32)


def write_corpus(path: Path, n: int) -> int:
    """The JSONL corpus of `n` passages (real first, then filler); returns the number of real ones."""
    real = _real_records()
    pool = sentence_pool(real)
    choice = filler_choice(max(0, n - len(real)), len(pool))
    tmp = path.with_suffix(".part")
    with open(tmp, "w", encoding="utf-8") as fh:
        for pid, title, text in real[:n]:
            fh.write(json.dumps({"id": pid, "title": title, "text": text}, ensure_ascii=False) + "\n")
        for i, row in enumerate(choice):
            title = f"{pool[row[0]][0]} ({i})"
            text = " ".join(pool[j][1] for j in row)
            fh.write(json.dumps({"id": f"f{i}", "title": title, "text": text}, ensure_ascii=False) + "\n")
    tmp.rename(path)
    return min(n, len(real))


def _encode_resumable(model, texts: list[str], out: Path) -> int:
    """Encode `texts` into `out` (.npy) chunk by chunk, resuming after the last finished chunk; returns how
    many were encoded by this call."""
    dim = model.get_sentence_embedding_dimension()
    done_file = out.with_suffix(".done")
    if out.exists() and done_file.exists():
        arr = np.lib.format.open_memmap(out, mode="r+")
        start = int(done_file.read_text())
    else:
        arr = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(len(texts), dim))
        start = 0
    t0 = time.perf_counter()
    for i in range(start, len(texts), CHUNK):
        arr[i : i + CHUNK] = model.encode(texts[i : i + CHUNK], batch_size=128, normalize_embeddings=True)
        arr.flush()
        done_file.write_text(str(min(i + CHUNK, len(texts))))
        rate = (min(i + CHUNK, len(texts)) - start) / (time.perf_counter() - t0)
        log.info("%s: %d / %d encoded (%.0f/s)", out.name, min(i + CHUNK, len(texts)), len(texts), rate)
    return len(texts) - start


def embed(work: Path, real_limit: int | None = None) -> dict:
    """Encode the sentence pool and the real passages (cached in `work`); returns timing facts.

    `real_limit`: encode at most this many real passages (the rest get sentence-mean vectors).
    """
    from drmas_envs.search.retrievers.dense import _load_model, resolve_encoder

    real = _real_records()
    pool = sentence_pool(real)
    model = _load_model(resolve_encoder("minilm").model)
    model.max_seq_length = MAX_TOKENS
    facts = {}
    for name, texts in (
        ("pool", [s for _, s in pool]),
        ("real", [f"{title}. {text}" if title else text for _, title, text in real[:real_limit]]),
    ):
        t = time.perf_counter()
        encoded = _encode_resumable(model, texts, work / f"{name}_vectors.npy")
        if encoded:
            facts[f"{name}_per_s"] = encoded / (time.perf_counter() - t)
        facts[f"{name}_n"] = len(texts)
    return facts


def encoded_real(work: Path) -> int:
    """How many real passages have encoder vectors (the encoding may have been stopped part way)."""
    done = work / "real_vectors.done"
    return int(done.read_text()) if done.exists() else 0


def write_vectors(work: Path, n: int, out: Path) -> None:
    """The (n, 384) vectors in corpus order, from the cached encodings (chunked: memory stays small).

    Real passages past those encoded (see `encoded_real`) get a filler-style vector: the mean of three
    pool sentences (seed 2), like the filler passages.
    """
    real = np.load(work / "real_vectors.npy", mmap_mode="r")
    pool = np.load(work / "pool_vectors.npy")
    n_real = min(n, len(real))
    n_enc = min(n_real, encoded_real(work))
    choice = filler_choice(max(0, n - len(real)), len(pool))
    rest = np.random.default_rng(2).integers(0, len(pool), size=(n_real - n_enc, SENTENCES_PER_FILLER))
    arr = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(n, real.shape[1]))
    arr[:n_enc] = real[:n_enc]
    for first, rows_all in ((n_enc, rest), (n_real, choice)):
        for start in range(0, len(rows_all), 65_536):
            rows = rows_all[start : start + 65_536]
            mean = pool[rows].mean(axis=1)
            mean /= np.linalg.norm(mean, axis=1, keepdims=True)
            arr[first + start : first + start + len(rows)] = mean
    arr.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/drmas-retrieval-scale"))
    parser.add_argument("--n", type=int, default=1_000_000)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.work.mkdir(parents=True, exist_ok=True)
    facts = embed(args.work)
    (args.work / "embed_facts.json").write_text(json.dumps(facts, indent=1))
    log.info("embedding facts: %s", facts)


if __name__ == "__main__":
    main()
