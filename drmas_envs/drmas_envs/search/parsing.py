"""Tag extraction from model output. Regexes only; nothing in model text is evaluated."""

from __future__ import annotations

import re

from drmas_envs.tags import reference_tag_view
from drmas_envs.workflow import Parsed

_NAMES = ("search", "answer", "verify")
_OPEN = {n: re.compile(rf"<{n}>", re.IGNORECASE) for n in _NAMES}
_CLOSE = {n: re.compile(rf"</{n}>", re.IGNORECASE) for n in _NAMES}
_DONE = re.compile(r"<done\s*/?>", re.IGNORECASE)


def _first_tag(text: str, name: str) -> tuple[str, int] | None:
    """(content, start) of the first complete <name>...</name>, in linear time.

    Equivalent to a non-greedy regex but linear: if the first opening tag has no closing tag
    after it, no later one has either (a regex would rescan the rest once per opening tag).
    """
    start = _OPEN[name].search(text)
    if start is None:
        return None
    end = _CLOSE[name].search(text, start.end())
    return None if end is None else (text[start.end() : end.start()], start.start())


def last_tag(text: str, name: str) -> str | None:
    """The content of the last complete <name>...</name>, in linear time."""
    close = None
    for match in _CLOSE[name].finditer(text):
        close = match
    if close is None:
        return None
    opening = None
    for match in _OPEN[name].finditer(text, 0, close.start()):
        opening = match
    return None if opening is None else text[opening.end() : close.start()]


def first_action(text: str, names: tuple[str, ...]) -> tuple[str, str, int] | None:
    """The earliest complete action in `text`: (name, content, position); "done" has no content."""
    best: tuple[str, str, int] | None = None
    for name in names:
        if name == "done":
            match = _DONE.search(text)
            found = None if match is None else ("", match.start())
        else:
            found = _first_tag(text, name)
        if found and (best is None or found[1] < best[2]):
            best = (name, found[0], found[1])
    return best


def parse_query(content: str, max_chars: int) -> Parsed:
    """A `<search>` payload: one non-empty line of text, clipped to `max_chars`."""
    query = " ".join(content.split())[:max_chars].strip()
    return Parsed(True, ("search", query)) if query else Parsed(False, ("search", None), "empty search query")


def parse_answer(content: str, max_chars: int) -> Parsed:
    """An `<answer>` payload: non-empty text, clipped to `max_chars`."""
    answer = " ".join(content.split())[:max_chars].strip()
    return Parsed(True, ("answer", answer)) if answer else Parsed(False, ("answer", None), "empty answer")


def parse_verdict(text: str) -> Parsed:
    """The last `<verify>` tag, "yes" or "no" (any case, spaces allowed); otherwise malformed."""
    tag = last_tag(text, "verify")
    if tag is None:
        return Parsed(False, None, "no <verify>...</verify> tag")
    verdict = tag.strip().lower()
    if verdict not in ("yes", "no"):
        return Parsed(False, None, f"unknown verdict {verdict[:40]!r} (expected yes or no)")
    return Parsed(True, verdict)


def reference_verdict(text: str) -> Parsed:
    """The verdict as the reference code reads it: well-formed iff `<verify>` and `</verify>` occur; "yes" if
    `<verify>yes</verify>` occurs anywhere (any case; the first tag's content stripped of spaces first:
    `drmas_envs.tags`), else "no" if `<verify>no</verify>` does, else None.

    "yes" wins over "no"; a call with no verdict (None) counts as the env's `malformed_verdict`.
    """
    view, valid = reference_tag_view(text, "<verify>", "</verify>")
    lower = view.lower()
    verdict = next((v for v in ("yes", "no") if f"<verify>{v}</verify>" in lower), None)
    return Parsed(valid, verdict, "" if valid else "no <verify>...</verify> tag")


def parse_action(text: str, names: tuple[str, ...], max_chars: int) -> Parsed:
    """The first of the allowed actions (`search`, `answer`, `done`); malformed if there is none."""
    found = first_action(text, names)
    if found is None:
        tags = ", ".join("<done>" if n == "done" else f"<{n}>...</{n}>" for n in names)
        return Parsed(False, None, f"no complete action tag (expected one of {tags})")
    name, content, _ = found
    if name == "search":
        return parse_query(content, max_chars)
    if name == "answer":
        return parse_answer(content, max_chars)
    return Parsed(True, ("done", None))


def think_error(text: str) -> str:
    """Why `text` fails the reference's think check (exactly one `<think>` before one `</think>`), or ""."""
    opens, closes = text.count("<think>"), text.count("</think>")
    if opens != 1 or closes != 1:
        return f"expected exactly one <think>...</think>, found {opens} <think> and {closes} </think>"
    if text.find("</think>") < text.find("<think>"):
        return "</think> comes before <think>"
    return ""
