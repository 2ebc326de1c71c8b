r"""Per-role prompt templates from a user's file (`make(..., prompts_file="my_prompts.yaml")`).

The file maps each role to its template, as JSON (`.json`) or YAML (`.yaml` / `.yml`, needs PyYAML):

    verifier:
      system: You are a careful reviewer.
      user: "Problem: {problem}\n\n{history}Review the latest solution; end with <verify>approve</verify> ..."
      reply_prefix: ""          # optional

Roles not named keep the env's templates. Every template is checked when the env is made: an unknown
role, a missing or extra key, a value that is not text, a broken `str.format` template, a field that is
not a plain name (no format spec, conversion, attribute or index) or a field the env does not fill is an
error that names the file and the key.
"""

from __future__ import annotations

import json
import os
import string
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from drmas_envs.workflow import PromptTemplate

TEMPLATE_KEYS = ("system", "user", "reply_prefix")
"""The keys a role's entry may hold; `system` and `user` are required."""


class PromptFileError(ValueError):
    """A prompts file that cannot be used; the message names the file and the bad key."""


def template_fields(text: str, where: str) -> set[str]:
    """The names of the fields a `str.format` template uses.

    Raises:
        PromptFileError: the template is malformed (a lone brace) or uses a positional field.

    """
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as exc:
        raise PromptFileError(f"{where}: not a valid template ({exc}); write a literal brace twice: {{{{ }}}}") from exc
    names = set()
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name or name.isdigit():
            raise PromptFileError(f"{where}: positional field {{{name}}}; name a field, e.g. {{problem}}")
        # A plain name only: a format spec can ask for a field padded to any width ({problem:>400000000}), and
        # attribute or index access ({problem.__class__}) reaches into the objects behind the context.
        if not name.isidentifier() or spec or conversion:
            shown = name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
            raise PromptFileError(f"{where}: field {{{shown}}}: a field is a plain name, e.g. {{problem}}")
        names.add(name)
    return names


def check_template(template: PromptTemplate, fields: Collection[str], where: str) -> None:
    """Raise PromptFileError if the user template uses a field outside `fields` (the env's context)."""
    unknown = template_fields(template.user, f"{where}.user") - set(fields)
    if unknown:
        raise PromptFileError(
            f"{where}.user: unknown field(s) {sorted('{' + u + '}' for u in unknown)}; this env fills {sorted(fields)}"
        )


def _read(path: Path) -> Any:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise PromptFileError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as exc:
            raise PromptFileError(f"{path}: reading YAML needs PyYAML (pip install pyyaml), or use JSON") from exc
        try:
            return yaml.load(text, Loader=_loader_without_aliases(yaml))  # a SafeLoader: no object-building tags
        except yaml.YAMLError as exc:
            raise PromptFileError(f"{path}: not valid YAML ({exc})") from exc
        except _AliasFound as exc:
            raise PromptFileError(f"{path}:{exc.args[0]}: YAML aliases (*name) are not accepted") from None
    raise PromptFileError(f"{path}: a prompts file is .json, .yaml or .yml")


class _AliasFound(Exception):
    """An alias at the given line."""


def _loader_without_aliases(yaml: Any) -> type:
    """PyYAML's SafeLoader, refusing aliases: nested ones turn a few hundred bytes into gigabytes."""

    class Loader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                raise _AliasFound(self.peek_event().start_mark.line + 1)
            return super().compose_node(parent, index)

    return Loader


def _template(entry: Any, where: str) -> PromptTemplate:
    if not isinstance(entry, Mapping):
        raise PromptFileError(f"{where}: expected a mapping with keys system, user[, reply_prefix]")
    extra = sorted(set(entry) - set(TEMPLATE_KEYS))
    if extra:
        raise PromptFileError(f"{where}: unknown key(s) {extra}; keys: {list(TEMPLATE_KEYS)}")
    for key in ("system", "user"):
        if key not in entry:
            raise PromptFileError(f"{where}: missing key {key!r}")
    for key, value in entry.items():
        if not isinstance(value, str):
            raise PromptFileError(f"{where}.{key}: expected text, got {type(value).__name__}")
    return PromptTemplate(entry["system"], entry["user"], entry.get("reply_prefix", ""))


def load_prompts_file(
    path: str | os.PathLike, roles: Collection[str], fields: Collection[str]
) -> dict[str, PromptTemplate]:
    """The templates a prompts file gives, per role, checked against the env's roles and context fields.

    Args:
        path: a .json, .yaml or .yml file mapping role -> {system, user[, reply_prefix]}.
        roles: the env's roles; the file may name any of them.
        fields: the fields the env's context fills (what a user template may use).

    Raises:
        FileNotFoundError: no such file.
        PromptFileError: anything else wrong with it; the message names the file and the key.

    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompts_file {path} not found")
    data = _read(path)
    if not isinstance(data, Mapping) or not data:
        raise PromptFileError(f"{path}: expected a mapping of role -> template, e.g. {{solver: {{system, user}}}}")
    out = {}
    for role, entry in data.items():
        if role not in roles:
            raise PromptFileError(f"{path}: unknown role {role!r}; roles: {list(roles)}")
        template = _template(entry, f"{path}: {role}")
        check_template(template, fields, f"{path}: {role}")
        out[str(role)] = template
    return out
