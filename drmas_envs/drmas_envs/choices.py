"""Closed choices of the env options: each a `Literal` type, declared once, and checked from that type.

An option dataclass annotates a field with one of these (or with its own `Literal` alias, declared next to
it) and calls `check_choices` in `__post_init__`, so the accepted values are written once, in the type.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

VerdictParsing = Literal["strict", "reference"]
"""How a Verifier reply's verdict is read (the math and search envs' `verdict_parsing`)."""


def choices(tp: Any) -> tuple[Any, ...]:
    """The values of a `Literal` annotation (also inside `X | None`); () for any other type."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    return tuple(v for arg in typing.get_args(tp) for v in choices(arg)) if typing.get_origin(tp) else ()


def check_choices(options: Any) -> None:
    """Raise ValueError naming the field for the first `Literal`-typed field of `options` that holds another value.

    Args:
        options: an option dataclass instance (`SearchConfig`, `MathConfig`, ...).

    """
    hints = typing.get_type_hints(type(options))
    for f in dataclasses.fields(options):
        allowed = choices(hints[f.name])
        value = getattr(options, f.name)
        if allowed and value not in allowed and not (value is None and type(None) in typing.get_args(hints[f.name])):
            raise ValueError(f"{f.name} must be one of {allowed}, not {value!r}")
