"""`drmas-train --help-config`: every config field, with its type, default and help line.

The help lines are the docstrings written under each dataclass field (the modules of this package).
Python keeps no such docstrings at run time, so they are read from the classes' source with `ast`.
A field typed with a `Literal` (`drmas_train.config.choices`) lists its choices. Fields whose type
is a dataclass are sections and are listed recursively; `dict[str, <dataclass>]` fields (per-agent
overrides, per-worker pools) are listed with a placeholder key, e.g. `agents.<name>.lr`.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import textwrap
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from drmas_train.config.choices import choices
from drmas_train.config.train import TrainConfig

PLAIN_FLAGS: dict[str, str] = {
    "env.id": "--env",
    "steps": "--steps",
    "algo.estimator": "--estimator",
    "models.assignment": "--assignment",
    "models.name": "--model",
    "models.backend": "--backend",
    "placement.mode": "--placement",
    "placement.ray_address": "--ray-address",
    "log.run_dir": "--run-dir",
    "seed": "--seed",
}
"""Config fields that also have a short flag of their own (dotted key -> flag)."""

PLACEHOLDERS = {"agents": "<agent>", "placement.pools": "<worker>"}
"""The placeholder key shown for `dict[str, <dataclass>]` sections."""


@dataclass(frozen=True)
class FieldHelp:
    """One config field as `--help-config` lists it."""

    key: str
    """Dotted key, as `--set` takes it (placeholders in angle brackets)."""
    type: str
    """The annotated type, e.g. `float | None`; `section` for a nested dataclass."""
    default: str
    """The default as YAML/JSON text; empty for sections."""
    doc: str
    """The help line: the field's docstring (a section without one: its class docstring)."""
    choices: tuple[str, ...] = ()
    """The values a `Literal` field takes (`drmas_train.config.choices`); () for any other field."""


@functools.cache
def _class_docs(cls: type) -> tuple[str, dict[str, str]]:
    """(class docstring, field name -> docstring) of one class, read from its source ('' if unavailable)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):  # no source (frozen app, REPL): no help lines
        return "", {}
    node = tree.body[0]
    if not isinstance(node, ast.ClassDef):
        return "", {}
    docs: dict[str, str] = {}
    for stmt, nxt in zip(node.body, node.body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[stmt.target.id] = _one_paragraph(nxt.value.value)
    return _one_paragraph(ast.get_docstring(node) or ""), docs


def _one_paragraph(text: str) -> str:
    return " ".join(inspect.cleandoc(text).split())


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> docstring of dataclass `cls`, base classes included."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_class_docs(klass)[1])
    return docs


def type_name(tp: Any) -> str:
    """A short readable form of an annotation: `float | None`, `dict[str, str]`, `PoolSize`."""
    if tp is type(None):
        return "None"
    if tp is Any:
        return "Any"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:  # its values are listed as the field's choices
        return type(args[0]).__name__
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in args)}]"
    return getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _as_text(value: Any) -> str:
    """The default as the text `--set` would take (JSON is YAML): null, true, 1e-06, "shared", [...]."""
    if value is dataclasses.MISSING:
        return "(required)"
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


def field_choices(key: str) -> tuple[str, ...]:
    """The choices of the field at dotted `key` (e.g. "algo.estimator"); () if it has none or no such field."""
    return next((f.choices for f in iter_fields() if f.key == key), ())


def iter_fields(cls: type = TrainConfig, prefix: str = "") -> Iterator[FieldHelp]:
    """Every field of dataclass `cls`, depth first, sections before their fields."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        doc = docs.get(f.name, "")
        nested = _dataclass_of(tp)
        if nested is not None:
            yield FieldHelp(key, "section", "", doc or _class_docs(nested)[0])
            yield from iter_fields(nested, f"{key}.")
            continue
        values = typing.get_args(tp)
        if typing.get_origin(tp) is dict and len(values) == 2 and dataclasses.is_dataclass(values[1]):
            yield FieldHelp(key, f"dict[str, {type_name(values[1])}]", "{}", doc or _class_docs(values[1])[0])
            yield from iter_fields(values[1], f"{key}.{PLACEHOLDERS.get(key, '<name>')}.")
            continue
        yield FieldHelp(key, type_name(tp), _as_text(_default(f)), doc, choices(tp))


def _dataclass_of(tp: Any) -> type | None:
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def render(prefix: str = "", width: int = 100) -> str:
    """The `--help-config` text: every field (whose key starts with `prefix`) with its help line."""
    lines = [
        "Config fields of drmas-train. Set any of them with --set KEY=VALUE or --KEY VALUE (the value is read",
        "as YAML: 1e-5, true, null, [a, b]) or in a preset file (--preset FILE.yaml, nested mappings).",
        "",
    ]
    for item in iter_fields():
        if not item.key.startswith(prefix):
            continue
        head = item.key + (f" ({item.type})" if item.type == "section" else f": {item.type} = {item.default}")
        extras = []
        if item.choices:
            extras.append(f"Choices: {', '.join(item.choices)}.")
        if item.key in PLAIN_FLAGS:
            extras.append(f"Flag: {PLAIN_FLAGS[item.key]}.")
        text = " ".join([item.doc or "(no description)", *extras])
        lines.append(head)
        lines.append(
            textwrap.fill(text, width, initial_indent="    ", subsequent_indent="    ", break_on_hyphens=False)
        )
    return "\n".join(lines)
