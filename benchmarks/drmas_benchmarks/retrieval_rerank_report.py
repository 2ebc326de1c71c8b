"""The dense_reranked rows of benchmarks/results/retrieval_scale.{json,md}, from `retrieval_rerank.py`'s results.

The JSON gets a `dense_reranked` entry beside the other kinds (its raw results inside it);
`retrieval_scale_report.write_report` keeps that entry and renders its section when it rewrites the files.
"""

from __future__ import annotations

import json
from pathlib import Path

from drmas_benchmarks.retrieval_scale_report import E5_DIM, GIB, MINILM_DIM, N_REAL, WIKI18

E5_MINUS_MINILM_ENCODER = (109_482_240 - 22_713_216) * 4
"""float32 weight bytes e5-base-v2 (109.5M parameters) holds beyond all-MiniLM-L6-v2 (22.7M), in the server."""
STEP_SEARCHES = 640 * 3
"""Searches per training step at the largest batch the brief names: 640 episodes x 3 searches."""
PAGES_PER_E5_VECTOR = 1.75
"""4 KiB pages one e5 vector (3,072 bytes at offset 45 + 3,072 i) spans, on average: 2 for three in four."""
COMMAND = "python -m drmas_benchmarks.retrieval_rerank --n {n} --nprobe {nprobe} --shortlist {shortlist}"


def _serve_rows(res: dict) -> dict[str, dict]:
    return {f"{'cold' if r['cold'] else 'warm'}_{r['clients']}": r for r in res["serve"]["runs"]}


def summary(res: dict) -> dict:
    """The issue's fields for the re-ranked kind, its wiki-18 projection, and the raw results."""
    n, served = res["n"], res["serve"]
    rows = _serve_rows(res)
    grid = res["recall"]["reranked"][f"{served['nprobe']}/{served['shortlist']}"]
    index_anon = max(r["loaded_anon"] - r["base_anon"] for r in rows.values())  # grows with the passages
    working = max(r["rss_anon"] - r["loaded_anon"] for r in rows.values())  # requests in flight: does not
    base_anon = max(r["base_anon"] for r in rows.values())
    per_million = index_anon / GIB / (n / 1e6)
    flat_bytes = n * MINILM_DIM * 4
    pq_extra = (E5_DIM - MINILM_DIM) // 4  # PQ bytes per passage at dim / 4
    wiki_index = per_million * GIB * WIKI18 / 1e6 + pq_extra * WIKI18
    wiki_anon = base_anon + E5_MINUS_MINILM_ENCODER + wiki_index + working
    warm, cold = rows["warm_64"], rows["cold_64"]
    reads_per_query = served["shortlist"] * PAGES_PER_E5_VECTOR
    return {
        "passages": n,
        "nprobe": served["nprobe"],
        "shortlist": served["shortlist"],
        "recall_at_3": round(grid["recall_at_3"], 3),
        "recall_at_10": round(grid["recall_at_10"], 3),
        "recall_note": "re-ranked IVF-PQ vs exact float32 search over the same MiniLM vectors, HotpotQA dev questions",
        "serve_gib_per_million": round(per_million, 3),
        "serve_anon_base_gib": round(base_anon / GIB, 2),
        "serve_anon_working_gib": round(working / GIB, 3),
        "page_cache_working_set_gib": {k: round(r["vectors_resident"] / GIB, 3) for k, r in rows.items()},
        "vectors_file_gib": round(flat_bytes / GIB, 3),
        "qps": round(warm["qps"], 1),
        "p50_ms": round(warm["p50_ms"], 1),
        "p99_ms": round(warm["p99_ms"], 1),
        "cold_qps": round(cold["qps"], 1),
        "cold_p50_ms": round(cold["p50_ms"], 1),
        "cold_p99_ms": round(cold["p99_ms"], 1),
        "by_run": {k: {m: round(r[m], 1) for m in ("qps", "p50_ms", "p99_ms", "load")} for k, r in rows.items()},
        "build_s": round(res["build"]["build_s"], 1),
        "build_gib_per_million": round((res["build"]["peak_anon"] - res["build"]["base_anon"]) / GIB / (n / 1e6), 3),
        "build_anon_gib": round((res["build"]["peak_anon"] - res["build"]["base_anon"]) / GIB, 3),
        "disk_gib": round(sum(res["build"]["disk"].values()) / GIB, 3),
        "cold_read_pages_per_candidate": round(
            rows["cold_1"]["disk_read_bytes"] / 4096 / rows["cold_1"]["requests"] / served["shortlist"], 2
        ),
        "hit_at_3": res.get("hits"),
        "projection_wiki18": {
            "passages": WIKI18,
            "dims": E5_DIM,
            "serve_anon_gib": round(wiki_anon / GIB, 1),
            "serve_anon_index_gib": round(wiki_index / GIB, 1),
            "vectors_file_gib": round(WIKI18 * E5_DIM * 4 / GIB, 1),
            "disk_reads_per_query_cold": reads_per_query,
            "disk_reads_per_step_cold": round(STEP_SEARCHES * reads_per_query),
            "page_cache_touched_per_step_gib": round(STEP_SEARCHES * reads_per_query * 4096 / GIB, 2),
            "note": "anonymous = the measured base (interpreter, torch, MiniLM) + e5's extra weights + the index's"
            " measured anonymous memory per million x 21.0 + 96 more PQ bytes per passage + the measured working"
            " memory of 64 clients; reads = shortlist x 1.75 pages per query, none cached",
        },
        "raw": res,
    }


def _grid_lines(rec: dict) -> list[str]:
    shortlists = sorted({v["shortlist"] for v in rec["reranked"].values()})
    head = "| nprobe | IVF-PQ alone | " + " | ".join(f"shortlist {s}" for s in shortlists) + " |"
    lines = [head, "|---" * (len(shortlists) + 2) + "|"]
    for nprobe, plain in rec["compressed"].items():
        cells = [f"{plain['recall_at_3']:.3f} / {plain['recall_at_10']:.3f}"]
        for s in shortlists:
            g = rec["reranked"][f"{nprobe}/{s}"]
            cells.append(f"{g['recall_at_3']:.3f} / {g['recall_at_10']:.3f} ({g['search_ms_per_query']:.1f} ms)")
        lines.append(f"| {nprobe} | " + " | ".join(cells) + " |")
    return lines


def _vectors(run: dict) -> str:
    n, real, filler = run["n"], min(run["real_encoded"], N_REAL), min(run["filler_encoded"], run["n"] - N_REAL)
    rest = run["n"] - N_REAL - filler
    means = f", the other {rest:,} means of three MiniLM sentence embeddings" if rest else ""
    return f"{n:,} passages: the {N_REAL:,} real ones ({real:,} with an encoder pass) and {n - N_REAL:,} filler" + (
        f" ({filler:,} with an encoder pass{means})"
    )


def _quality_lines(run: dict) -> list[str]:
    """Recall grid, the shortlist needed, and hit@3 of one run."""
    rec, hits = run["recall"], run.get("hits") or {}
    rank = rec.get("pq_rank_of_exact_top3")
    load = "/".join(f"{x:.1f}" for x in rec.get("load", []))
    lines = [
        f"recall@3 / recall@10 against exact float32 search, {rec['queries']} HotpotQA dev questions, IVF-PQ"
        f" nlist {rec['nlist']}, {rec['pq_bytes']} bytes per passage; in brackets the batched search time per"
        f" query (warm page cache, no encoding; 1-min load average at the stage's start / end {load}):",
        "",
        *_grid_lines(rec),
        "",
    ]
    if rank:
        lines += [
            "Searching every cluster, IVF-PQ alone ranks the last of a query's exact top 3 at (percentiles"
            f" p50 / p90 / p99 / max) {rank['p50']:.0f} / {rank['p90']:.0f} / {rank['p99']:.0f} / {rank['p100']:.0f}:"
            " the shortlist that holds the exact top 3.",
            "",
        ]
    if hits:
        lines += [
            f"hit@3 (a gold answer inside one of the top 3 passages), re-ranked at shortlist {hits['shortlist']};"
            " HotpotQA: dev questions with their gold paragraphs in the corpus, yes/no answers dropped; NQ: the"
            " test-1000 questions with an answer string in some passage of this corpus:",
            "",
            "| questions | n | exact | nprobe | re-ranked | IVF-PQ alone | re-ranked top 3 = exact top 3 |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, h in hits.items():
            if isinstance(h, dict) and "by_nprobe" in h:
                for probe, b in h["by_nprobe"].items():
                    lines.append(
                        f"| {name} | {h['questions']} | {h['exact']:.3f} | {probe} | {b['reranked']:.3f} |"
                        f" {b['compressed']:.3f} | {b['reranked_same_top3_as_exact']:.3f} |"
                    )
        lines.append("")
    return lines


def section(s: dict) -> list[str]:
    """The markdown section of the re-ranked kind."""
    res, p = s["raw"], s["projection_wiki18"]
    rows = _serve_rows(res)
    lines = [
        "## Re-ranked dense (dense_reranked): IVF-PQ shortlist, exact float32 re-scoring from the vectors on disk",
        "",
        f"Command: `{COMMAND.format(n=res['n'], nprobe=s['nprobe'], shortlist=s['shortlist'])}`"
        f" (`benchmarks/drmas_benchmarks/retrieval_rerank.py`). Machine: {res['machine']}, shared; 1-min load"
        " average per run below. Vectors all-MiniLM-L6-v2, 384 dims, inputs cut at 32 word pieces: "
        + _vectors(res)
        + ".",
        "",
        *_quality_lines(res),
        "| run | clients | queries/s | p50 ms | p99 ms | RssAnon: index / after the run, GiB | vectors resident GiB"
        " | disk read per request | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r in rows.items():
        lines.append(
            f"| {key.split('_')[0]} | {r['clients']} | {r['qps']:.1f} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} |"
            f" {(r['loaded_anon'] - r['base_anon']) / GIB:.3f} / {(r['rss_anon'] - r['base_anon']) / GIB:.3f} |"
            f" {r['vectors_resident'] / GIB:.3f} |"
            f" {r['disk_read_bytes'] / max(1, r['requests']) / 1024:.0f} KiB | {r['load']:.1f} |"
        )
    lines += [
        "",
        f"Served at nprobe {s['nprobe']}, shortlist {s['shortlist']}, stdlib server, query encoding included;"
        " each client sends its own questions (none repeats within a run). Cold: the vectors file evicted"
        " (posix_fadvise DONTNEED) before the server started; warm: read whole before. RssAnon: the server's"
        " anonymous memory once the index is loaded, and after the run, over its own before the index was"
        f" loaded (encoder and libraries: {s['serve_anon_base_gib']} GiB); what a run adds is requests in"
        " flight, which does not grow with the corpus. Vectors resident: the vectors file's pages mapped in the"
        f" server (the file is {s['vectors_file_gib']} GiB): in a cold run the pages its searches read (the"
        " page-cache working set, equal to the disk reads); in a warm run more, since the kernel maps cached"
        " neighbours of each page touched (fault-around). The 1-client runs are the most exposed to the other"
        " jobs on the 2 cores: their order (warm slower than cold) is that noise. Build:"
        f" {s['build_s']:.0f} s at load {res['build']['load']:.1f}, peak anonymous growth {s['build_anon_gib']:.2f}"
        " GiB, most of it fixed (the"
        " training sample, one chunk of vectors, the recall check; the codes are 96 bytes per passage), so"
        " per million it overstates;"
        f" on disk {s['disk_gib']:.2f} GiB (the index folder with its flat copy of the vectors).",
        "",
    ]
    for other in s.get("smaller_runs", []):
        cmd = COMMAND.format(n=other["n"], nprobe=other["hits"]["nprobe"], shortlist=other["hits"]["shortlist"])
        lines += [f"At {_vectors(other)} (`{cmd} --stages build,recall,hits`):", "", *_quality_lines(other)]
    lines += [
        f"wiki-18 projection (e5, 768 dims; not measured): anonymous memory {p['serve_anon_gib']} GiB, of which"
        f" the index {p['serve_anon_index_gib']} GiB; the"
        f" {p['vectors_file_gib']} GiB vectors file (the reference's e5_Flat.index, used in place) in the page"
        f" cache as far as RAM allows; cold, each search reads {p['disk_reads_per_query_cold']:.0f} pages of 4 KiB,"
        f" a step of 640 episodes x 3 searches {p['disk_reads_per_step_cold']:,} reads"
        f" ({p['page_cache_touched_per_step_gib']} GiB); measured here, cold, a search read"
        f" {s['cold_read_pages_per_candidate']:.2f} pages per shortlisted passage of 1,536 bytes. How: {p['note']}.",
        "",
    ]
    return lines


def write_rerank(res: dict, out_dir: Path, smaller: list[dict] | None = None) -> None:
    """Put the re-ranked kind into retrieval_scale.json and re-render retrieval_scale.md; `smaller`: runs of
    the quality stages only (recall, hits) at other sizes, shown beside it."""
    from drmas_benchmarks.retrieval_scale_report import write_report

    path = out_dir / "retrieval_scale.json"
    data = json.loads(path.read_text())
    data["dense_reranked"] = {**summary(res), "smaller_runs": smaller or []}
    path.write_text(json.dumps(data, indent=1, default=float))
    write_report(data["raw"], out_dir)
