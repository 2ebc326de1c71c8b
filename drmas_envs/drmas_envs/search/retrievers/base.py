"""The retriever interface: a batch of queries in, the top-k passages with scores out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Passage:
    """One retrieved passage.

    Attributes:
        id: the passage id in its corpus.
        title: the article title ("" when the corpus has none).
        text: the passage body.
        score: the retriever's score for the query (higher is better).

    """

    id: str
    title: str
    text: str
    score: float = 0.0

    @property
    def contents(self) -> str:
        r"""Search-R1's single-field form: '"Title"\ntext'."""
        return f'"{self.title}"\n{self.text}'


def split_contents(contents: str) -> tuple[str, str]:
    r"""Invert `Passage.contents`: '"Title"\ntext' -> (title, text); no first line means no title."""
    first, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents
    first = first.strip()
    if len(first) >= 2 and first[0] == first[-1] == '"':
        first = first[1:-1]
    return first, rest


def passage_fields(item: Mapping[str, Any], where: str = "") -> tuple[str, str]:
    """(title, text) of a corpus record with `title` + `text`, or Search-R1's `contents`.

    Raises:
        ValueError: the record has neither form (the message starts with `where`, e.g. "file:line").

    """
    if "text" in item:
        return str(item.get("title") or ""), str(item["text"])
    if "contents" in item:
        return split_contents(str(item["contents"]))
    raise ValueError(f"{where}: a passage needs `text` (and optional `title`) or `contents`")


@runtime_checkable
class Retriever(Protocol):
    """Anything that answers a batch of queries with the top-k passages of each, best first."""

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        """One list of at most `k` passages per query, best first."""
        ...
