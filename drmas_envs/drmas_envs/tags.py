"""The reference code's reading of an action tag, shared by the envs' `verdict_parsing="reference"` options.

The reference (langfengQ/DrMAS@19c632b, `general_projection` with `return_whole_response=True`) finds the
first opening and the first closing tag, calls the reply well-formed iff both occur, and strips the
whitespace between them before the verdict is looked up: `<verify> reject </verify>` reads as
`<verify>reject</verify>`. Exact, case-sensitive string search; nothing is evaluated.
"""

from __future__ import annotations


def reference_tag_view(text: str, start_tag: str, end_tag: str) -> tuple[str, bool]:
    """(`text` as the reference looks it up, whether both tags occur).

    With both tags present, the text between the first `start_tag` and the first `end_tag` is stripped
    of surrounding whitespace (Python slicing, as the reference: a closing tag before the opening one
    leaves an empty span); otherwise `text` is returned unchanged.
    """
    start, end = text.find(start_tag), text.find(end_tag)
    if start == -1 or end == -1:
        return text, False
    inner = start + len(start_tag)
    return text[:inner] + text[inner:end].strip() + text[end:], True
