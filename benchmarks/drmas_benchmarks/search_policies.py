"""No-model policies for the search envs, playing through the env's API (`drmas_envs.evaluate`).

Each policy is stateless: it reads the question and the retrieved passages from the observation's user
message (as a model would) and writes `<search>...</search>` or `<answer>...</answer>` for the one-agent
searcher. `fit` learns every reader from the held-out worlds' training worlds (`search_fitted`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from drmas_benchmarks.search_fitted import (
    Doc,
    Extractor,
    RelationClassifier,
    TypeGuesser,
    candidates,
    common_answers,
    names_in,
)
from drmas_envs.search.env import heldout_retriever
from drmas_envs.search.heldout import ANSWER_TYPES, heldout_world

Decide = Callable[[str, list[list[Doc]]], tuple[str, str]]
"""(question, the passages of each search so far) -> ("search", query) or ("answer", answer)."""

_QUESTION = re.compile(r"^Question: (.*?)\n\nSearch history:", re.S)
_STEP = re.compile(r"^Step \d+: <search>.*?</search>\n<information>(.*?)</information>", re.S | re.M)
_DOC = re.compile(r"^Doc \d+\(Title: (.*?)\) (?=\S)(.*)$", re.M)


def read_observation(user: str) -> tuple[str, list[list[Doc]]]:
    """(question, [[(title, text) of each passage] per search step]) from a searcher's user message."""
    question = _QUESTION.search(user).group(1)
    return question, [_DOC.findall(block) for block in _STEP.findall(user)]


def subject_query(question: str) -> str:
    """The question's capitalised name: its longest run of capitalised words after the first word."""
    runs = re.findall(r"(?:[A-Z][a-z]+ ?)+", " ".join(question.split()[1:]))
    return max((r.strip() for r in runs), key=len, default=question)


@dataclass
class Policy:
    """A stateless searcher: `decide` says what to do next from the question and the passages so far."""

    decide: Decide

    def act(self, user: str) -> str:
        question, steps = read_observation(user)
        kind, payload = self.decide(question, steps)
        if kind == "search" and "Searches left: 0." in user:
            kind, payload = "answer", "unknown"
        return f"<{kind}>{payload or 'unknown'}</{kind}>"

    def __call__(self, agent: str, observations: list[dict]) -> list[str]:
        return [self.act(o["user"]) for o in observations]


def one_search(answer: Callable[[str, list[Doc]], str | None], query: Callable[[str], str] = str) -> Policy:
    """Search once with `query(question)`, then answer from that search's passages."""

    def decide(question: str, steps: list[list[Doc]]) -> tuple[str, str]:
        return ("search", query(question)) if not steps else ("answer", answer(question, steps[0]) or "")

    return Policy(decide)


def no_search(answer: Callable[[str], str | None]) -> Policy:
    """Answer at once."""
    return Policy(lambda question, steps: ("answer", answer(question) or ""))


@dataclass
class Fitted:
    """Every reader fitted on the training worlds."""

    relation: RelationClassifier
    chain: RelationClassifier
    extractor: Extractor
    type_guesser: TypeGuesser
    common: dict[str, str]


def _docs(key: str, query: str, k: int = 3) -> list[Doc]:
    return [(p.title, p.text) for p in heldout_retriever(key, "bm25", "minilm").search([query], k)[0]]


def gold_passage(key: str, question: dict, hop: int = -1) -> Doc:
    """A passage of the question's chain: by default the one that holds its answer (the last supporting title)."""
    title = question["supporting_titles"][hop]
    return next((t, x) for _, t, x in heldout_world(key).passages if t == title)


def fit(train_worlds: int) -> Fitted:
    """Fit every reader on the single-hop (and, for the chain classifier, two-hop) questions of the training
    worlds, each with the passages a search with the question returns plus its gold passage."""
    keys = [f"train-{i}" for i in range(train_worlds)]
    single = [(k, q) for k in keys for q in heldout_world(k).questions if q["hops"] == 1]
    examples = []
    for key, q in single:
        docs, gold = _docs(key, q["question"]), gold_passage(key, q)
        examples.append((q["question"], q["relation"], docs + [gold] * (gold not in docs), q["golden_answers"][0]))
    extractor = Extractor().fit(examples)
    two = [(q["question"], q["relation"]) for k in keys for q in heldout_world(k).questions if q["hops"] == 2]
    return Fitted(
        relation=RelationClassifier().fit((q, r) for q, r, _, _ in examples),
        chain=RelationClassifier().fit(two),
        extractor=extractor,
        type_guesser=TypeGuesser(extractor).fit([(q, r, d[:1], g) for q, r, d, g in examples]),
        common=common_answers((r, g) for _, r, _, g in examples),
    )


def typed_guesser(entities: dict[str, Sequence[str]], rule: str) -> Callable[[str, str, Sequence[Doc]], str | None]:
    """The answer's true type (an oracle tagger: the world's own entity lists) and nothing else: the
    first/last/most frequent mention of that type in the top passage, the question's names left out."""
    by_name = {name: kind for kind in ANSWER_TYPES for name in entities.get(kind, ())}

    def guess(question: str, answer_type: str, docs: Sequence[Doc]) -> str | None:
        subject = names_in(question)
        spans = [
            c.text
            for c in candidates(question, docs[:1], set(entities.get("prof", ())) | set(entities.get("industry", ())))
        ]
        typed = [s for s in spans if (s.isdigit() if answer_type == "year" else by_name.get(s) == answer_type)]
        typed = [s for s in typed if not set(s.split()) & subject]
        if not typed:
            return None
        return {"first": typed[0], "last": typed[-1], "frequent": max(typed, key=typed.count)}[rule]

    return guess


OLD_RULES = (
    ("year", r"founded in (\d+)"),
    ("river", r"on the (\w+) river"),
    ("country", r"is a city in (\w+)"),
    ("born", r"born \d+ in (\w+)"),
    ("profession", r"is an? (\w+)\."),
    ("founded", r"by ([A-Z]\w+ [A-Z]\w+)"),
    ("headquarters", r"headquarters are in (\w+)"),
)
"""The 7 rules of the regex policy, written for the classic world's sentences: (question keyword, pattern)."""


def regex_answer(question: str, docs: list[Doc]) -> str | None:
    """The old regex policy: the first rule whose keyword the question holds, on the top passage."""
    text = docs[0][1] if docs else ""
    lower = question.lower()
    for keyword, pattern in OLD_RULES:
        if keyword in lower:
            found = re.search(pattern, text)
            return found.group(1) if found else ""
    return ""


def chain(fitted: Fitted) -> Policy:
    """Not a trivial policy: the scripted two-hop reader. Search the question, read the middle entity with the
    first relation's extractor, search that entity, read the answer with the second relation's."""

    def decide(question: str, steps: list[list[Doc]]) -> tuple[str, str]:
        first, _, second = fitted.chain(question).partition(">")
        if not steps:
            return "search", question
        bridge = fitted.extractor(question, first, steps[0]) or ""
        if len(steps) == 1:
            return "search", bridge
        return "answer", fitted.extractor(question, second, steps[1], subject=set(bridge.split())) or ""

    return Policy(decide)
