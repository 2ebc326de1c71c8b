"""The tables of `drmas_benchmarks.retrieval_scale`: per-million figures, wiki-18 projections, markdown and JSON."""

from __future__ import annotations

import json
from pathlib import Path

GIB = 2**30
WIKI18 = 21_015_324
"""Passages in wiki-18 (the reference's corpus)."""
E5_DIM, MINILM_DIM = 768, 384
REFERENCE_FLAT_BYTES = WIKI18 * E5_DIM * 4
"""The reference's e5_Flat.index: 21M x 768 float32 (~64.6 GB, 60.1 GiB)."""
EXTRA_BYTES_AT_E5 = {
    "bm25": 0,
    "dense_exact": (E5_DIM - MINILM_DIM) * 4,  # float32 per dimension
    "dense_compressed": (E5_DIM - MINILM_DIM) // 4,  # one PQ byte per 4 dimensions
}
"""Bytes per passage that e5's 768 dimensions add over MiniLM's 384 (what the projection adds)."""
COMMAND = "python -m drmas_benchmarks.retrieval_scale --n {n} --seconds {seconds:g} --kinds {kinds}{real}{recall}"
N_REAL = 32_717
"""Real passages in the benchmark's corpus (../shared/data/corpus/wiki_passages.jsonl.gz)."""


def vector_source(run: dict) -> str:
    """How a run's vectors were made: one encoder pass per passage, or sentence means past the encoded ones."""
    emb, n = run.get("embed", {}), run["n"]
    n_real = run.get("n_real", N_REAL)
    real, filler = emb.get("real_encoded", 0), emb.get("filler_encoded", 0)
    if real >= n_real and filler >= n - n_real:
        return f"one MiniLM encoder pass per passage, all {n:,}"
    return (
        f"encoder passes for {real:,} of {n_real:,} real and {filler:,} of {n - n_real:,} filler passages,"
        " means of three MiniLM sentence embeddings for the rest"
    )


def encoder_bytes(row: dict, runs: list[dict]) -> int:
    """RSS of loading the encoder and faiss: this dense server's baseline minus a BM25 server's.

    The dense builds load the encoder (the retriever they return holds it), so their peak RSS includes it;
    it does not grow with the corpus, so it is subtracted before dividing by millions of passages.
    """
    bm25 = [r["kinds"]["bm25"]["serve_base_rss"] for r in runs if "bm25" in r["kinds"]]
    return max(0, row["serve_base_rss"] - min(bm25)) if bm25 else 0


def anon_per_million(row: dict, n: int) -> float | None:
    """Build GiB per million passages of anonymous memory (RssAnon peak growth), if the run sampled it."""
    if "peak_anon" not in row:
        return None
    return (row["peak_anon"] - row["base_anon"]) / GIB / (n / 1e6)


def per_million(row: dict, n: int, encoder: int = 0) -> tuple[float, float]:
    """(build GiB, serve GiB) per million passages: RSS growth over the process's pre-index baseline
    (less `encoder` bytes for a dense build)."""
    build = (row["peak_rss"] - row["base_rss"] - encoder) / GIB / (n / 1e6)
    serve = (row["serve_rss"] - row["serve_base_rss"]) / GIB / (n / 1e6)
    return build, serve


def merge(runs: list[dict]) -> dict:
    """One results dict from several runs: each kind's row from the largest run that measured it."""
    merged = {"kinds": {}, "runs": runs}
    for run in sorted(runs, key=lambda r: r["n"]):
        for kind, row in run["kinds"].items():
            enc = encoder_bytes(row, runs) if kind != "bm25" and not row.get("encoder_in_base") else 0
            merged["kinds"][kind] = {**row, "n": run["n"], "encoder_bytes": enc, "vectors": vector_source(run)}
        if "recall" in run:
            merged["recall"] = run["recall"]
    return merged


def summary(results: dict) -> dict:
    """The issue's JSON: per kind passages, build_s, build/serve GiB per million, qps, p99_ms (+ recall_at_3)."""
    out: dict = {}
    for kind, row in results["kinds"].items():
        n = row["n"]
        build, serve = per_million(row, n, row["encoder_bytes"] if kind != "bm25" else 0)
        rss_build = max(0.0, build)  # a dense build that only references its vectors grows by less than the noise
        anon = anon_per_million(row, n)
        build = max(0.0, anon) if anon is not None else rss_build
        out[kind] = {
            "passages": n,
            "build_s": round(row["build_s"], 1),
            "build_gib_per_million": round(build, 3),
            "build_rss_gib_per_million": round(rss_build, 3),
            "serve_gib_per_million": round(serve, 3),
            "qps": round(row["qps"], 1),
            "p99_ms": round(row["p99_ms"], 1),
        }
        if kind == "dense_compressed" and "recall" in results:
            out[kind]["recall_at_3"] = round(results["recall"]["recall_at_3"], 3)
            out[kind]["recall_note"] = "IVF-PQ vs exact search over the same MiniLM vectors, HotpotQA dev questions"
        extra = EXTRA_BYTES_AT_E5[kind] * 1e6 / GIB
        out[kind]["projection_wiki18"] = {
            "passages": WIKI18,
            "dims": E5_DIM if kind != "bm25" else None,
            "serve_gib": round((serve + extra) * WIKI18 / 1e6, 1),
            "build_gib": round((build + (extra if kind == "dense_compressed" else 0)) * WIKI18 / 1e6, 1),
            "build_s_linear": round(row["build_s"] * WIKI18 / n, 0),
            "note": "projection from the per-million figures (linear), not measured",
        }
    out["reference_flat_index_gib"] = round(REFERENCE_FLAT_BYTES / GIB, 1)
    return out


def _encoder_note(results: dict) -> str:
    """The sentence on subtracting the encoder's RSS, for runs that loaded it after the build's baseline."""
    subtracted = [
        f"{k} {r['encoder_bytes'] / 2**20:.0f} MiB" for k, r in results["kinds"].items() if r["encoder_bytes"]
    ]
    if not subtracted:
        return ""
    return (
        " In runs that did not sample RssAnon, the dense builds loaded the encoder after the baseline; its RSS"
        f" (that dense server's baseline minus a BM25 server's: {', '.join(subtracted)}) is subtracted from"
        " their build peak."
    )


def _pq_bytes_note(path: Path) -> list[str]:
    """What retrieval_pq_bytes.py measured: recall at more bytes per passage, and why top-3 is fragile here."""
    if not path.exists():
        return []
    d = json.loads(path.read_text())
    rows = [
        f"{m} bytes: " + ", ".join(f"nprobe {k} {v:.3f}" for k, v in r["recall_at_3_by_nprobe"].items())
        for m, r in d["by_m"].items()
    ]
    return [
        "",
        "Recall levels off with nprobe, so the product quantiser, not the clusters searched, bounds it; more"
        f" bytes per passage (`--pq-m`) raise it (`benchmarks/drmas_benchmarks/retrieval_pq_bytes.py`, {path.name}): "
        + "; ".join(rows)
        + f". The corpus makes top-3 agreement hard: its exact 3rd and 4th scores differ by a median of"
        f" {d['exact_gap_3rd_4th_median']:.4f} (top score {d['exact_top1_score_median']:.2f}), since the"
        " filler recombines 16,384 real sentences, so many passages score nearly alike"
        f" ({d['exact_top3_real_share']:.0%} of the exact top 3 are real passages). For e5's 768 dims the"
        " default dim / 4 is 192 bytes per passage (4.0 GB of codes for wiki-18).",
    ]


def _table(results: dict, summ: dict) -> list[str]:
    lines = [
        "| index | passages | build s | build GiB / 1M | (with file pages) | serve GiB / 1M | on disk GiB | queries/s"
        " | p50 ms | p99 ms | failures |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, row in results["kinds"].items():
        s = summ[kind]
        lines.append(
            f"| {kind} | {s['passages']:,} | {s['build_s']:.0f} | {s['build_gib_per_million']:.2f} | "
            f"{s['build_rss_gib_per_million']:.2f} | "
            f"{s['serve_gib_per_million']:.2f} | {row['disk_bytes'] / GIB:.2f} | {s['qps']:.1f} | "
            f"{row['p50_ms']:.0f} | {s['p99_ms']:.0f} | {row['failures']} of {row['requests'] + row['failures']} |"
        )
    return lines


def _projection(summ: dict) -> list[str]:
    lines = [
        "| index | projected serve memory | projected build memory | projected build time (linear) |",
        "|---|---|---|---|",
        f"| reference: e5 flat FAISS (`e5_Flat.index`, 21M x 768 float32) | {summ['reference_flat_index_gib']} GiB "
        "(file size; held in GPU or CPU memory) | - | - |",
    ]
    for kind in ("bm25", "dense_exact", "dense_compressed"):
        if kind in summ:
            p = summ[kind]["projection_wiki18"]
            lines.append(
                f"| {kind} | {p['serve_gib']} GiB | {p['build_gib']} GiB | {p['build_s_linear'] / 3600:.1f} h |"
            )
    return lines


def write_report(runs: list[dict], out_dir: Path) -> None:
    """Write retrieval_scale.json (the issue's keys, plus the raw runs) and retrieval_scale.md."""
    results = merge(runs)
    summ = summary(results)
    path = out_dir / "retrieval_scale.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    kept = {k: old[k] for k in ("dense_reranked",) if k in old}  # written by retrieval_rerank.py
    path.write_text(json.dumps({**summ, **kept, "raw": runs}, indent=1, default=float))
    rec = results.get("recall", {})
    commands = [
        COMMAND.format(
            n=r["n"],
            seconds=r["seconds"],
            kinds=",".join(r["kinds"]),
            real=""
            if r.get("embed", {}).get("real_encoded", 0) >= r.get("n_real", N_REAL)
            else f" --real-encoded {r['embed']['real_encoded']}",
            recall=f" --recall-queries {r['recall']['queries']}" if "recall" in r else "",
        )
        for r in runs
    ]
    first = runs[0]
    lines = [
        "# Retrieval at scale: BM25, exact dense and IVF-PQ dense over one machine's corpus",
        "",
        "Commands: " + "; ".join(f"`{c}`" for c in commands) + " (corpus and vectors:"
        " `benchmarks/drmas_benchmarks/retrieval_scale_data.py`). Each index kind is reported at the largest size it"
        " was run at.",
        f"Machine: {first['machine']}; shared with other engineers' jobs (1-min load average per run below).",
        "",
        f"Corpus: the {N_REAL:,} real passages + filler made of recombined real sentences (three each)."
        " Vectors all-MiniLM-L6-v2 (384 dims, inputs cut at 32 word pieces), per dense run: "
        + "; ".join(f"{kind}: {row['vectors']}" for kind, row in results["kinds"].items() if kind != "bm25")
        + ". Recall is MiniLM's, not e5's (e5-base-v2 cannot be downloaded here).",
        "",
        *_table(results, summ),
        "",
        f"{first['clients']} concurrent keep-alive clients, one query per request in Search-R1's format"
        f' (`{{"queries": [q], "topk": 3, "return_scores": true}}`), {first["seconds"]:g} s per index,'
        " query encoding included, stdlib server, client and server on the same 2 cores.",
        "Build memory per million: the peak of anonymous memory (RssAnon, sampled every 50 ms: what the build"
        " needs and the kernel cannot drop) over the process before the build, the encoder preloaded in that"
        " baseline; '(with file pages)': VmHWM growth, which also counts pages of the memory-mapped files"
        " read and written. Serve memory per million: RSS growth over the server before its index was loaded"
        " (encoder and libraries in the baseline), divided by millions of passages."
        + _encoder_note(results)
        + " Serving RSS is read after the load run, so memory-mapped pages"
        " the searches touched count (for exact dense: every vector, each batch scans them all; for all: the"
        " passage store's pages read and the query encoder's working memory, fixed costs that per-million"
        " figures from a smaller run overstate). RSS also counts"
        " file-backed pages of memory-mapped inputs and outputs (the streamed vectors, the BM25 arrays being"
        " written), which the kernel can drop under memory pressure: the build figures are upper bounds."
        " A dense_exact build only writes the passage store and references the vectors (shown as 0 when its"
        " growth is below the encoder's).",
        "",
        "Load (1-min average) before build / after serving: "
        + "; ".join(f"{k} {r['load_before'][0]:.1f} / {r['load_after'][0]:.1f}" for k, r in results["kinds"].items()),
        "",
    ]
    if rec:
        by = ", ".join(f"nprobe {k}: {v:.3f}" for k, v in rec["by_nprobe"].items())
        br = rec["build_report"]
        lines += [
            "## Recall of the compressed index",
            "",
            f"recall@3 of IVF-PQ (nlist {br['nlist']}, {br['m']} bytes per passage, served at nprobe"
            f" {rec['built_nprobe']}) against exact search over the same vectors, {rec['queries']} HotpotQA dev"
            f" questions encoded with MiniLM: **{rec['recall_at_3']:.3f}** ({by}).",
            f"At build time (`build_index` reports it; {br['queries']}): {br['recall']:.3f}.",
            *_pq_bytes_note(out_dir / "retrieval_pq_bytes.json"),
            "",
        ]
    emb = max(runs, key=lambda r: r.get("embed", {}).get("filler_encoded", 0)).get("embed", {})
    if emb:
        lines += [
            "## Encoding cost",
            "",
            "MiniLM on this CPU, inputs cut at 32 word pieces (`retrieval_scale_data.py`; the filler under"
            " bf16 autocast, cosine 0.99999 to fp32; load 2-15 while it ran, other jobs at nice 17): "
            + ", ".join(f"{k[:-6]} {v:.0f} texts/s" for k, v in emb.items() if k.endswith("_per_s"))
            + ". For wiki-18 the reference's e5_Flat.index already holds the vectors, and `--vectors` streams"
            " them, so no encoding is needed there.",
            "",
        ]
    lines += [
        "## wiki-18 (21,015,324 passages, e5 768 dims): projections, not measurements",
        "",
        "Per-million figures x 21.0; dense kinds add e5's extra bytes per passage (float32: +1,536 B exact;"
        " PQ codes at dim / 4: +96 B compressed). Build time is linear in passages here; IVF-PQ's coarse"
        " assignment also grows with nlist (4,096 at 21M vs 1,024 at 1M) and dimension, so read it as a lower"
        " bound. Build memory is scaled linearly too, though part of it is fixed (IVF-PQ: the training sample and"
        " one chunk of vectors; BM25: one chunk of tokens), so those figures overstate. The e5 encoding of 21M"
        " passages is not included: the reference's index file provides the vectors.",
        "",
        *_projection(summ),
        "",
    ]
    if "dense_reranked" in kept:
        from drmas_benchmarks.retrieval_rerank_report import section  # it imports this module

        lines += section(kept["dense_reranked"])
    (out_dir / "retrieval_scale.md").write_text("\n".join(lines))
