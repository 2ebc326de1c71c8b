"""The bar a search team must clear on the held-out worlds: no-model policies, fitted on the training worlds.

Every policy plays search-1agent through `drmas_envs.evaluate` (`world="held-out"`, BM25, 3 passages a
search) and is scored per question source: `world-template`, `world-reworded-question`,
`world-reworded-passage`, `world-two-hop` (docs/search.md). The readers are learned from the training
worlds (`search_fitted`), never written for the wordings; the chain row is not a trivial policy but the
scripted two-hop reader, to show that the two-hop questions can be answered by searching the first answer.

    .venv/bin/python -m drmas_benchmarks.search_trivial_policies [--train-worlds 4] \\
        [--out benchmarks/results/search_trivial_policies]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import drmas_envs
from drmas_benchmarks.search_policies import (
    Fitted,
    Policy,
    chain,
    fit,
    gold_passage,
    no_search,
    one_search,
    regex_answer,
    subject_query,
    typed_guesser,
)
from drmas_envs.search.env import heldout_retriever
from drmas_envs.search.heldout import FACT_TYPE, RELATION, heldout_questions, heldout_world, world_keys
from drmas_envs.search.metrics import contains_answer

ANSWER_TYPE = {RELATION[f]: t for f, t in FACT_TYPE.items()}
"""Question relation -> its answer's type."""

SOURCES = ("world-template", "world-reworded-question", "world-reworded-passage", "world-two-hop")
TRAIN_SOURCES = ("world-single-hop", "world-two-hop")


def _typed_rule(train_worlds: int, fitted: Fitted) -> str:
    """The pick rule (first, last, most frequent) that does best for the true-type guesser on training."""
    best = {}
    for rule in ("first", "last", "frequent"):
        hits = 0
        for key in world_keys("train", train_worlds):
            guess = typed_guesser(heldout_world(key).entities, rule)
            for q in (q for q in heldout_world(key).questions if q["hops"] == 1):
                docs = [gold_passage(key, q, 0)]
                hits += guess(q["question"], ANSWER_TYPE[q["relation"]], docs) == q["golden_answers"][0]
        best[rule] = hits
    return max(best, key=best.get)


def policies(fitted: Fitted, split: str, train_worlds: int, rule: str) -> dict[str, tuple[Policy, dict]]:
    """Policy name -> (policy, env options: the step budget, and the hop filter for the chain), for `split`.

    "Oracle retrieval" hands a policy the passage of the question's own entity that holds the asked fact:
    the single-hop answer's passage, the first hop of a two-hop question. The last extractor row is handed
    the answer's passage even on two-hop questions (the passage only the second search finds): a measure of
    the reading, not a policy.
    """
    rel, questions = fitted.relation, heldout_questions(split, train_worlds)
    first = {q["question"]: gold_passage(q["world"], q, 0) for q in questions}
    last = {q["question"]: gold_passage(q["world"], q, -1) for q in questions}
    entities: dict[str, set[str]] = {}
    for key in world_keys(split, train_worlds):  # the true-type tagger knows the split's own worlds
        for kind, names in heldout_world(key).entities.items():
            entities.setdefault(kind, set()).update(names)
    typed = typed_guesser(entities, rule)
    one, chained = {"max_steps": 2}, {"max_steps": 3, "hops": [2]}
    return {
        "answer type, shape only (fitted), after searching the question": (
            one_search(lambda q, d: fitted.type_guesser(q, rel(q), d)), one),
        f"answer type, true types (oracle tagger, {rule}), after searching the question": (
            one_search(lambda q, d: typed(q, ANSWER_TYPE[rel(q)], d)), one),
        f"answer type, true types (oracle tagger, {rule}), oracle retrieval": (
            no_search(lambda q: typed(q, ANSWER_TYPE[rel(q)], [first[q]])), one),
        "most common training answer per relation": (no_search(lambda q: fitted.common.get(rel(q))), one),
        "old regex (7 rules) after searching the capitalised name": (one_search(regex_answer, subject_query), one),
        "fitted extractor after searching the question": (one_search(lambda q, d: fitted.extractor(q, rel(q), d)), one),
        "fitted extractor, oracle retrieval": (no_search(lambda q: fitted.extractor(q, rel(q), [first[q]])), one),
        "not a policy: fitted extractor handed the answer's passage": (
            no_search(lambda q: fitted.extractor(q, rel(q), [last[q]])), one),
        "not trivial: scripted chain (search, read the middle entity, search it, read)": (chain(fitted), chained),
    }  # fmt: skip


def score(policy: Policy, **env: Any) -> dict[str, dict[str, float]]:
    """avg@1 per source and overall ("all"), with the question counts."""
    out = drmas_envs.evaluate(policy, "search-1agent", k=1, topk=3, world="held-out", **env)
    rows = {s: {"em": r["avg@1"], "n": r["n_problems"]} for s, r in out["by_source"].items()}
    return {**rows, "all": {"em": out["avg@1"], "n": out["n_problems"]}}


def classic_regex() -> dict[str, dict[str, float]]:
    """The old regex policy on the classic world's test split, where it was written."""
    out = drmas_envs.evaluate(one_search(regex_answer, subject_query), "search-1agent", k=1, max_steps=2, split="test")
    rows = {s: {"em": r["avg@1"], "n": r["n_problems"]} for s, r in out["by_source"].items()}
    return {**rows, "all": {"em": out["avg@1"], "n": out["n_problems"]}}


def run(train_worlds: int) -> dict[str, Any]:
    """Fit on the training worlds, then score every policy on a training world, validation and test."""
    start = time.time()
    fitted = fit(train_worlds)
    rule = _typed_rule(train_worlds, fitted)
    results: dict[str, Any] = {"train_worlds": train_worlds, "fit_s": round(time.time() - start, 1), "splits": {}}
    splits = {"train-0": ("train", 1), "validation": ("validation", train_worlds), "test": ("test", train_worlds)}
    for name, (split, worlds) in splits.items():  # train-0: the first training world alone, in-sample
        found = {p: score(policy, split=split, train_worlds=worlds, **env)
                 for p, (policy, env) in policies(fitted, split, worlds, rule).items()}  # fmt: skip
        results["splits"][name] = found
    results["classic_regex"] = classic_regex()
    results["relation_accuracy"] = _relation_accuracy(fitted, train_worlds)
    results["retrieval"] = retrieval()
    results["seconds"] = round(time.time() - start, 1)
    return results


def retrieval(key: str = "test-0") -> dict[str, dict[str, float]]:
    """BM25 on a world: how often the answer is in the top 3 of a search with the question, per source; and for
    two-hop questions, how often a search for the question's entity finds the middle entity, and a search for
    the middle entity the answer, in the top k (k = 1, 2, 3)."""
    search = heldout_retriever(key, "bm25", "minilm").search
    questions = heldout_world(key).questions

    def share(pairs: list[tuple[str, str]], k: int) -> float:
        hits = [any(contains_answer(f"{p.title} {p.text}", [a]) for p in search([q], k)[0]) for q, a in pairs]
        return round(sum(hits) / len(hits), 3)

    by_source = {s: [(q["question"], q["golden_answers"][0]) for q in questions if q["source"] == s] for s in SOURCES}
    out = {"question, top 3": {s: share(pairs, 3) for s, pairs in by_source.items()}}
    two = [q for q in questions if q["hops"] == 2]
    for k in (1, 2, 3):
        out[f"top {k}"] = {
            "entity -> middle entity": share([(q["entity"], q["bridge"]) for q in two], k),
            "middle entity -> answer": share([(q["bridge"], q["golden_answers"][0]) for q in two], k),
        }
    return out


def _relation_accuracy(fitted: Fitted, train_worlds: int) -> dict[str, float]:
    """How often the fitted classifier names a single-hop question's relation, per test source."""
    hits: dict[str, list[bool]] = {}
    for q in heldout_questions("test", train_worlds):
        if q["hops"] == 1:
            hits.setdefault(q["source"], []).append(fitted.relation(q["question"]) == q["relation"])
    return {s: round(sum(v) / len(v), 3) for s, v in sorted(hits.items())}


def report(results: dict[str, Any]) -> str:
    """The Markdown table of `run`'s results."""
    lines = ["# Trivial policies on the held-out search worlds", "", __doc__.split("\n\n")[1].replace("\n", " "), ""]
    for split, found in results["splits"].items():
        cols = TRAIN_SOURCES if split.startswith("train") else SOURCES
        some = next(iter(found.values()))
        head = " | ".join(f"{c.removeprefix('world-')} ({some.get(c, {}).get('n', 0)})" for c in cols)
        lines += [f"## {split}", "", f"| policy | {head} | all ({some['all']['n']}) |", "|---" * (len(cols) + 2) + "|"]
        for name, row in found.items():
            cells = " | ".join(f"{row[c]['em']:.3f}" if c in row else "-" for c in cols)
            lines.append(f"| {name} | {cells} | {row['all']['em']:.3f} |")
        lines.append("")
    regex = results["classic_regex"]
    lines += ["## The old regex policy on the classic world (test split)", ""]
    lines += [", ".join(f"{s}: {r['em']:.3f} ({r['n']})" for s, r in regex.items()), ""]
    lines += ["## Retrieval on the test world (BM25)", "", "| search | " + " | ".join(results["retrieval"]) + " |"]
    lines += ["|---" * (len(results["retrieval"]) + 1) + "|"]
    rows = sorted({r for v in results["retrieval"].values() for r in v}, key=str)
    for r in rows:
        lines.append(
            f"| {r} | " + " | ".join(f"{v[r]:.3f}" if r in v else "-" for v in results["retrieval"].values()) + " |"
        )
    lines += [
        "",
        "(question, top 3: the share of each source's questions whose answer is in the top 3 of a search with "
        "the question; top k: two-hop questions, a search for the entity the question names finding the "
        "middle entity, a search for the middle entity finding the answer.)",
        "",
    ]
    lines += ["Relation classifier accuracy on the test world's single-hop questions: "
              + ", ".join(f"{s}: {v:.3f}" for s, v in results["relation_accuracy"].items()), ""]  # fmt: skip
    lines += [f"Fitted on {results['train_worlds']} training worlds in {results['fit_s']} s; the whole run took "
              f"{results['seconds']} s on {platform.machine()}, {platform.python_version()}.", "",
              "Reproduce: `.venv/bin/python -m drmas_benchmarks.search_trivial_policies`", ""]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train-worlds", type=int, default=4, help="training worlds the readers are fitted on")
    ap.add_argument("--out", default="benchmarks/results/search_trivial_policies", help="writes OUT.json, OUT.md")
    args = ap.parse_args(argv)
    results = run(args.train_worlds)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    out.with_suffix(".md").write_text(report(results))


if __name__ == "__main__":
    main()
