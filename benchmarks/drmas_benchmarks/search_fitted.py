"""Readers fitted to the held-out worlds' training worlds, for the trivial-policy bar (`search_trivial_policies`).

Everything here is learned from the training worlds' questions, gold answers and passages, nothing is
written for the wordings by hand:

- `RelationClassifier`: multinomial naive Bayes over a question's lower-case words -> its relation
  (`country`, `birthplace`, ...), or, fitted on two-hop questions, its chain (`founder>birthplace`).
- `Extractor`: one span ranker per relation (an averaged perceptron over the span's shape, the words
  around it with names masked, whether it is in the question, how its passage's title matches the
  question, the passage's rank), trained on every training wording; candidates are capitalised runs,
  numbers and the lower-case answers seen in training.
- `TypeGuesser`: the relation's answer shape alone: the first, last or most frequent candidate of that
  shape in the top passage, whichever did best on the training worlds.
- `common_answers`: the most frequent training answer per relation.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from drmas_envs.search.metrics import normalize_answer

TOKEN = re.compile(r"[A-Za-z]+|\d+|[^\sA-Za-z\d]")
Doc = tuple[str, str]
"""(title, text) of a passage, in retrieval order."""


def tokens(text: str) -> list[str]:
    """Words, numbers and punctuation marks."""
    return TOKEN.findall(text)


def names_in(question: str) -> set[str]:
    """The capitalised words of a question after its first word (the names it asks about)."""
    return {t for t in tokens(question)[1:] if t[0].isupper()}


def shape(span: str) -> str:
    """`year` (4 digits), `num`, `cap<n>` (n capitalised words) or `low` (lower-case words)."""
    if span.isdigit():
        return "year" if len(span) == 4 else "num"
    words = span.split()
    return f"cap{len(words)}" if all(w[0].isupper() for w in words) else "low"


@dataclass(frozen=True)
class Candidate:
    text: str
    features: tuple[str, ...]


def _mask(tok: str, subject: set[str]) -> str:
    if tok in subject:
        return "<S>"
    if tok.isdigit():
        return "<N>"
    return "<C>" if tok[0].isupper() else tok.lower()


def _spans(toks: list[str], vocab: set[str]) -> Iterable[tuple[int, int]]:
    """Candidate spans: numbers, lower-case answer words, and every run of 1-3 words inside a capitalised run."""
    i = 0
    while i < len(toks):
        if toks[i].isdigit() or toks[i] in vocab:
            yield i, i + 1
        if toks[i][0].isupper():
            j = i
            while j < len(toks) and toks[j][0].isupper() and toks[j].isalpha():
                j += 1
            for a in range(i, j):
                for b in range(a + 1, min(j, a + 3) + 1):
                    yield a, b
            i = max(j, i + 1)
            continue
        i += 1


def candidates(question: str, docs: Sequence[Doc], vocab: set[str], subject: set[str] | None = None) -> list[Candidate]:
    """Every candidate span of the passages with its features; `subject`: the names asked about (default: the
    question's)."""
    subject = names_in(question) if subject is None else subject
    out = []
    for rank, (title, text) in enumerate(docs, start=1):
        title_words = set(tokens(title)) & {t for t in tokens(title) if t[0].isupper()}
        match = "all" if title_words and title_words <= subject else "some" if title_words & subject else "none"
        toks = tokens(text)
        masked = [_mask(t, subject) for t in toks]
        for a, b in _spans(toks, vocab):
            span = " ".join(toks[a:b])
            left = ["<B>"] * 3 + masked[max(0, a - 3) : a]
            right = masked[b : b + 3] + ["<E>"] * 3
            feats = [f"shape={shape(span)}", f"title={match}", f"rank={rank}", f"inq={bool(set(toks[a:b]) & subject)}"]
            feats += [f"l1={left[-1]}", f"l2={' '.join(left[-2:])}", f"l3={' '.join(left[-3:])}"]
            feats += [f"r1={right[0]}", f"r2={' '.join(right[:2])}", f"r3={' '.join(right[:3])}"]
            feats += [f"l1r1={left[-1]}|{right[0]}"]
            out.append(Candidate(span, tuple(feats)))
    return out


@dataclass
class RelationClassifier:
    """Multinomial naive Bayes: a question's lower-case words -> its relation label."""

    counts: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    priors: Counter = field(default_factory=Counter)

    @staticmethod
    def words(question: str) -> list[str]:
        return [t.lower() for i, t in enumerate(tokens(question)) if t.isalpha() and (i == 0 or t[0].islower())]

    def fit(self, questions: Iterable[tuple[str, str]]) -> RelationClassifier:
        for text, label in questions:
            self.priors[label] += 1
            self.counts[label].update(self.words(text))
        return self

    def __call__(self, question: str) -> str:
        vocab = len(set().union(*self.counts.values()))

        def score(label: str) -> float:
            c, total = self.counts[label], sum(self.counts[label].values())
            return math.log(self.priors[label]) + sum(
                math.log((c[w] + 1) / (total + vocab)) for w in self.words(question)
            )

        return max(self.priors, key=score)


@dataclass
class Extractor:
    """One averaged-perceptron span ranker per relation, over `candidates`' features."""

    shapes: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    vocab: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    weights: dict[tuple[str, str], float] = field(default_factory=dict)

    def allowed(self, relation: str, cands: list[Candidate]) -> list[Candidate]:
        return [c for c in cands if shape(c.text) in self.shapes[relation]]

    def score(self, relation: str, cand: Candidate) -> float:
        return sum(self.weights.get((relation, f), 0.0) for f in cand.features)

    def fit(self, examples: Sequence[tuple[str, str, Sequence[Doc], str]], epochs: int = 6) -> Extractor:
        """`examples`: (question, relation, passages, gold answer)."""
        for _, relation, _, gold in examples:
            self.shapes[relation].add(shape(gold))
            if shape(gold) == "low":
                self.vocab[relation].add(gold)
        data = []
        for question, relation, docs, gold in examples:
            cands = self.allowed(relation, candidates(question, docs, self.vocab[relation]))
            golds = [c for c in cands if normalize_answer(c.text) == normalize_answer(gold)]
            if golds:
                data.append((relation, cands, golds))
        w: dict = defaultdict(float)
        total: dict = defaultdict(float)  # the running sum behind the averaged weights
        steps = 0
        for _ in range(epochs):
            for relation, cands, golds in data:
                steps += 1
                guess = max(cands, key=lambda c: sum(w[(relation, f)] for f in c.features))
                if guess in golds:
                    continue
                best = max(golds, key=lambda c: sum(w[(relation, f)] for f in c.features))
                for sign, cand in ((1.0, best), (-1.0, guess)):
                    for f in cand.features:
                        w[(relation, f)] += sign
                        total[(relation, f)] += sign * (epochs * len(data) - steps + 1)
        self.weights = {k: v / (epochs * len(data)) for k, v in total.items()}
        return self

    def __call__(
        self, question: str, relation: str, docs: Sequence[Doc], subject: set[str] | None = None
    ) -> str | None:
        cands = self.allowed(relation, candidates(question, docs, self.vocab[relation], subject))
        return max(cands, key=lambda c: self.score(relation, c)).text if cands else None


@dataclass
class TypeGuesser:
    """The relation's answer shape alone, with the pick rule (first, last, most frequent) fitted on training."""

    extractor: Extractor
    rule: str = "first"

    def pick(self, question: str, relation: str, docs: Sequence[Doc], rule: str) -> str | None:
        subject = names_in(question)
        cands = self.extractor.allowed(relation, candidates(question, docs[:1], self.extractor.vocab[relation]))
        texts = [c.text for c in cands if not set(c.text.split()) & subject]
        if not texts:
            return None
        return {"first": texts[0], "last": texts[-1], "frequent": Counter(texts).most_common(1)[0][0]}[rule]

    def fit(self, examples: Sequence[tuple[str, str, Sequence[Doc], str]]) -> TypeGuesser:
        def hits(rule: str) -> int:
            return sum(self.pick(q, r, d, rule) == g for q, r, d, g in examples)

        self.rule = max(("first", "last", "frequent"), key=hits)
        return self

    def __call__(self, question: str, relation: str, docs: Sequence[Doc]) -> str | None:
        return self.pick(question, relation, docs, self.rule)


def common_answers(examples: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Relation -> its most frequent gold answer, from (relation, answer) pairs."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for relation, answer in examples:
        counts[relation][answer] += 1
    return {r: c.most_common(1)[0][0] for r, c in counts.items()}
