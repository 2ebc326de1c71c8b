r"""Reading model text: the last `\boxed{...}` answer, the Verifier's verdict, and clipping.

Every function here accepts any string (unicode, empty, megabytes) and does bounded work on it:
the scans are capped, so a hostile output costs milliseconds, not minutes.
"""

from __future__ import annotations

import re
import typing
from typing import Literal

from drmas_envs.tags import reference_tag_view

BOX_COMMANDS = ("\\boxed", "\\fbox")
MAX_BOX_CHARS = 1000
"""A box whose content is longer than this is treated as not closed (an over-long answer is malformed)."""
MAX_BOX_TRIES = 32
r"""How many `\boxed` occurrences, from the last backwards, are tried before giving up."""

# Layout-only LaTeX that carries no answer: removed before deciding whether a box holds an answer.
_LAYOUT = re.compile(
    r"\\(?:text|textbf|textit|mathrm|mathbf|mathit|mbox|displaystyle|quad|qquad|left|right|,|;|:|!| )"
    r"|[\s${}~()\[\].,:;]"
)
# Placeholders a model emits instead of an answer (compared after removing layout and lowercasing).
_PLACEHOLDERS = frozenset({"", "answer", "finalanswer", "youranswer", "answerhere", "youranswerhere", "ldots", "dots"})
_PLACEHOLDER_COMMANDS = re.compile(r"\\(?:ldots|dots|cdots|vdots|square|blacksquare|boxed|fbox|placeholder)")

Verdict = Literal["approve", "reject"]
"""A math Verifier's verdicts (`missing_verdict` counts as one)."""
VERDICTS: tuple[Verdict, ...] = typing.get_args(Verdict)
# A verdict tag holds a short word; bounding it keeps the scan linear on 100 kB of "<verify>".
_VERDICT_TAG = re.compile(r"<verify>\s*([^<]{0,40}?)\s*</verify>", re.IGNORECASE)


def _box_content(text: str, start: int) -> str | None:
    """The brace-balanced content after the command at `start`, or None if not closed within the cap."""
    i = start
    n = len(text)
    while i < n and text[i] in " \t":
        i += 1
    if i >= n:
        return None
    if text[i] != "{":
        # `\boxed 5` form: one token up to whitespace or `$`.
        m = re.match(r"[^\s${}]{1,64}", text[i : i + 65])
        return m.group(0) if m else None
    depth = 0
    stop = min(n, i + MAX_BOX_CHARS + 2)
    for j in range(i, stop):
        c = text[j]
        if c == "{" and (j == 0 or text[j - 1] != "\\"):
            depth += 1
        elif c == "}" and (j == 0 or text[j - 1] != "\\"):
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def last_boxed(text: str) -> str | None:
    r"""The content of the last closed `\boxed{...}` (or `\fbox{...}`) in `text`, nested braces handled.

    An unclosed or over-long last box (e.g. a truncated output) falls back to the closed box before it.
    Returns None when there is none.
    """
    if not isinstance(text, str):
        return None
    end = len(text)
    for _ in range(MAX_BOX_TRIES):
        pos, cmd = max((text.rfind(c, 0, end), c) for c in BOX_COMMANDS)
        if pos < 0:
            return None
        after = pos + len(cmd)
        # A letter right after `\boxed` makes another command (`\boxedboxed`), not a box.
        content = None if text[after : after + 1].isalpha() else _box_content(text, after)
        if content is not None:
            return content.strip()
        end = pos
    return None


def is_answer(content: str | None) -> bool:
    r"""Whether a box's content is an answer, not empty or a placeholder ("", "\ldots", "answer", "?")."""
    if content is None:
        return False
    core = _PLACEHOLDER_COMMANDS.sub("", content)
    core = _LAYOUT.sub("", core).lower()
    if core in _PLACEHOLDERS:
        return False
    return any(ch.isalnum() for ch in core) or "\\" in core


def extract_answer(text: str) -> tuple[str | None, str]:
    """The answer in a Solver output and, when there is none, why ("" when there is one)."""
    content = last_boxed(text)
    if content is None:
        return None, "no closed \\boxed{...} answer"
    if not is_answer(content):
        return None, f"the \\boxed{{}} holds no answer: {content[:40]!r}"
    return content, ""


def extract_verdict(text: str) -> tuple[str | None, str]:
    """The Verifier's verdict ("approve" or "reject") and, when there is none, why.

    The last `<verify>...</verify>` tag counts. Tags that disagree (both verdicts present) make the
    output ambiguous, hence malformed; so does a tag holding anything but the two verdicts.
    """
    if not isinstance(text, str):
        return None, "not text"
    words = [m.group(1).strip().strip(".!").lower() for m in _VERDICT_TAG.finditer(text)]
    if not words:
        return None, "no <verify>approve</verify> or <verify>reject</verify> tag"
    if words[-1] not in VERDICTS:
        return None, f"unknown verdict {words[-1][:40]!r}"
    if len({w for w in words if w in VERDICTS}) > 1:
        return None, "both approve and reject tags"
    return words[-1], ""


def reference_verdict(text: str) -> tuple[str | None, bool, str]:
    """The verdict as the reference code reads it: (verdict or None, well-formed, why not).

    Well-formed iff `<verify>` and `</verify>` both occur; the verdict is "approve" if the exact tag
    `<verify>approve</verify>` occurs anywhere (the first tag's content stripped of spaces first:
    `drmas_envs.tags`), else "reject" if `<verify>reject</verify>` does, else None (the env's
    `missing_verdict` decides). An approving tag wins over a rejecting one.
    """
    if not isinstance(text, str):
        return None, False, "not text"
    view, valid = reference_tag_view(text, "<verify>", "</verify>")
    verdict = next((v for v in VERDICTS if f"<verify>{v}</verify>" in view), None)
    return verdict, valid, "" if valid else "no <verify>...</verify> tag"


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last number written in `text`, boxed or not (None when there is none).

    A format-independent read of a Solver output: it tells whether the model *knows* the answer
    even when it did not box it. Used for the loose `answer_acc` validation metric, never for reward.
    """
    if not isinstance(text, str):
        return None
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def clip_middle(text: str, max_chars: int) -> str:
    """`text` with its middle cut out when longer than `max_chars`, keeping the head and the tail.

    The tail is kept because that is where a solution's answer and a review's verdict sit.
    """
    if max_chars <= 0 or len(text) <= max_chars:
        return text
    head = max_chars // 4
    tail = max_chars - head
    return f"{text[:head]}\n[... {len(text) - max_chars} characters omitted ...]\n{text[-tail:]}"
