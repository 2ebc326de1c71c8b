"""The corpus and vectors of `drmas_benchmarks.retrieval_scale`: real passages plus filler, embedded with MiniLM.

Text: the real passages of ../shared/data/corpus/wiki_passages.jsonl.gz (read by path, never copied),
then filler passages up to `n`, each three sentences drawn at random (seed 0) from a pool of real
sentences, titled with the first sentence's article and a number. Vectors (all-MiniLM-L6-v2, 384 dims,
unit length, inputs cut at `MAX_TOKENS` word pieces, since whole passages take far longer to embed):
- every passage the encoder has been run on (`--real-limit`, `--filler-limit`; all by default): the
  encoder's embedding of "title. text" (first `MAX_TOKENS` word pieces);
- any passage past those limits: the normalised mean of the encoder's embeddings of three pool
  sentences, a stand-in made of real MiniLM outputs for quick runs (see `encoded` in the results).
With `--bf16` (on where the CPU has native bf16) the encoder's matmuls run under bf16 autocast, which
embeds faster there and stays close to the fp32 embedding (the cosine: benchmarks/results/retrieval_scale.md).

Everything is cached under the work folder, so the benchmark can be rerun without re-embedding.

    python -m drmas_benchmarks.retrieval_scale_data --work /tmp/drmas-retrieval-scale --n 1000000
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

ROOT = Path(__file__).resolve().parents[2]
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


def filler_passages(real: list[tuple[str, str, str]], n_filler: int) -> list[tuple[str, str]]:
    """The (title, text) of the first `n_filler` filler passages (the same whatever `n_filler`)."""
    pool = sentence_pool(real)
    choice = filler_choice(n_filler, len(pool))
    return [(f"{pool[row[0]][0]} ({i})", " ".join(pool[j][1] for j in row)) for i, row in enumerate(choice)]


def write_corpus(path: Path, n: int) -> int:
    """The JSONL corpus of `n` passages (real first, then filler); returns the number of real ones."""
    real = _real_records()
    tmp = path.with_suffix(".part")
    with open(tmp, "w", encoding="utf-8") as fh:
        for pid, title, text in real[:n]:
            fh.write(json.dumps({"id": pid, "title": title, "text": text}, ensure_ascii=False) + "\n")
        for i, (title, text) in enumerate(filler_passages(real, max(0, n - len(real)))):
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
        if len(arr) < len(texts):  # asked for more than an earlier, limited run: grow, keep what is done
            grown = np.lib.format.open_memmap(
                out.with_suffix(".grow.npy"), mode="w+", dtype=np.float32, shape=(len(texts), dim)
            )
            grown[:start] = arr[:start]
            grown.flush()
            del arr
            out.with_suffix(".grow.npy").rename(out)
            arr = np.lib.format.open_memmap(out, mode="r+")
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


def embed(work: Path, real_limit: int | None = None, filler_limit: int = 0, bf16: bool = False) -> dict:
    """Encode the sentence pool, the real passages and filler passages (cached in `work`); returns
    timing facts.

    `real_limit`: encode at most this many real passages; `filler_limit`: this many filler passages
    (the rest get sentence-mean vectors). `bf16`: run the encoder under bf16 autocast.
    """
    import contextlib

    import torch

    from drmas_envs.search.retrievers.dense import load_model, resolve_encoder

    real = _real_records()
    pool = sentence_pool(real)
    model = load_model(resolve_encoder("minilm").model)
    model.max_seq_length = MAX_TOKENS
    facts: dict = {"bf16_autocast": bf16} if filler_limit else {}
    for name, texts in (
        ("pool", [s for _, s in pool]),
        ("real", [f"{title}. {text}" if title else text for _, title, text in real[:real_limit]]),
        ("filler", [f"{title}. {text}" for title, text in filler_passages(real, filler_limit)]),
    ):
        if not texts:
            continue
        t = time.perf_counter()
        autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with autocast:
            encoded = _encode_resumable(model, texts, work / f"{name}_vectors.npy")
        if encoded:
            facts[f"{name}_per_s"] = encoded / (time.perf_counter() - t)
        facts[f"{name}_n"] = len(texts)
    return facts


def encoded_real(work: Path, name: str = "real") -> int:
    """How many real (or "filler") passages have encoder vectors (the encoding may have stopped part way)."""
    done = work / f"{name}_vectors.done"
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
    n_fill_enc = min(max(0, n - len(real)), encoded_real(work, "filler"))
    choice = filler_choice(max(0, n - len(real)), len(pool))[n_fill_enc:]
    rest = np.random.default_rng(2).integers(0, len(pool), size=(n_real - n_enc, SENTENCES_PER_FILLER))
    arr = np.lib.format.open_memmap(out, mode="w+", dtype=np.float32, shape=(n, real.shape[1]))
    arr[:n_enc] = real[:n_enc]
    if n_fill_enc:
        filler = np.load(work / "filler_vectors.npy", mmap_mode="r")
        for start in range(0, n_fill_enc, 65_536):
            stop = min(n_fill_enc, start + 65_536)
            arr[n_real + start : n_real + stop] = filler[start:stop]
    for first, rows_all in ((n_enc, rest), (n_real + n_fill_enc, choice)):
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
    parser.add_argument("--bf16", action="store_true", help="encode under bf16 autocast (CPUs with native bf16)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args.work.mkdir(parents=True, exist_ok=True)
    n_real = len(_real_records())
    facts = embed(args.work, filler_limit=max(0, args.n - n_real), bf16=args.bf16)
    (args.work / "embed_facts.json").write_text(json.dumps(facts, indent=1))
    log.info("embedding facts: %s", facts)


if __name__ == "__main__":
    main()
