"""Answer grading for QA: SQuAD normalisation, exact match and token F1 against a list of gold answers."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation and the articles a/an/the, squash whitespace."""
    text = text.lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str | None, golds: Iterable[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold answer, else 0.0 (None scores 0)."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str | None, golds: Iterable[str]) -> float:
    """The best token-level F1 of the normalised prediction against any gold answer (None scores 0)."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction).split()
    return max((_f1(pred, normalize_answer(g).split()) for g in golds), default=0.0)


def contains_answer(text: str, golds: Iterable[str]) -> bool:
    """Whether any non-empty normalised gold answer occurs in the normalised text (on word boundaries)."""
    hay = f" {normalize_answer(text)} "
    return any(g and f" {g} " in hay for g in (normalize_answer(x) for x in golds))
