"""Building a `TrainConfig`: defaults, then a YAML preset, then dotted overrides; and writing it back.

Any field can be set with `--set section.field=value` (YAML syntax for the value) or a dotted flag
`--section.field value`. Values are checked against the fields' annotations (a `Literal` field only
takes its choices), and unknown keys are rejected with the known ones named.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import yaml

from drmas_train.config.train import TrainConfig

PRESET_DIR = Path(__file__).resolve().parent.parent / "presets"
MAX_NUMBER = 1e15
"""The largest size any numeric field may have: past it a value is a typo or an attack, not a setting."""

T = TypeVar("T")


class ConfigSection(Protocol):
    """Any config dataclass: `TrainConfig` or one of its sections."""

    __dataclass_fields__: ClassVar[dict[str, Any]]


def _convert(tp: Any, value: Any, where: str) -> Any:
    """Check and convert a YAML value to the annotated type `tp`."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        given = [a for a in args if a is not type(None)]
        if len(given) == 1:  # `X | None`: the error is X's
            return _convert(given[0], value, where)
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(arg, value, where)
            except (TypeError, ValueError) as exc:
                errors.append(str(exc))
        raise TypeError(f"{where}: {value!r} fits none of {tp}: {'; '.join(errors)}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise TypeError(f"{where}: expected a mapping, got {value!r}")
        return from_dict(tp, value, where)
    if origin is dict:
        _, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise TypeError(f"{where}: expected a mapping, got {value!r}")
        return {str(k): _convert(val_tp, v, f"{where}.{k}") for k, v in value.items()}
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise TypeError(f"{where}: expected a list, got {value!r}")
        args = typing.get_args(tp)
        item_tp = args[0] if args else Any
        items = [_convert(item_tp, v, f"{where}[]") for v in value]
        return items if origin is list else tuple(items)
    if tp is Any:
        return value
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ValueError(f"{where} must be one of {allowed}, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise TypeError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp in (int, float):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{where}: expected {tp.__name__}, got {value!r}")
        if not math.isfinite(value) or abs(value) > MAX_NUMBER:  # NaN, inf, 1e400: never a setting
            raise ValueError(f"{where}: expected a finite number of at most {MAX_NUMBER:.0e} in size, got {value!r}")
        if tp is int and value != int(value):
            raise TypeError(f"{where}: expected int, got {value!r}")
        return tp(value)
    if tp is str:
        if not isinstance(value, str):
            raise TypeError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """Build dataclass `cls` from a nested dict, rejecting unknown keys and ill-typed values."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(names)}")
    return cls(**{k: _convert(hints[k], v, f"{where}.{k}") for k, v in data.items()})


def to_dict(cfg: ConfigSection) -> dict[str, Any]:
    """The config as plain nested dicts and lists (tuples become lists), for YAML."""

    def plain(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [plain(v) for v in x]
        return x

    return plain(dataclasses.asdict(cfg))


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `data["a"]["b"] = value` for key "a.b", creating mappings on the way."""
    *path, last = key.split(".")
    node = data
    for part in path:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"cannot set {key!r}: {part!r} is not a section")
    node[last] = value


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses aliases (`*name`): a few hundred bytes of nested aliases expand to
    gigabytes (a "billion laughs"), and no config needs them. Anchors alone are harmless and accepted.
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise ValueError(f"line {mark.line + 1}: YAML aliases (*name) are not accepted; write the value out")
        return super().compose_node(parent, index)


def read_yaml(text: str, source: str = "") -> Any:
    """YAML read safely (no tags that build objects, no aliases); `source` prefixes an error (a file's name)."""
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # a SafeLoader: no object-building tags
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}" if source else str(exc)) from None


def parse_assignment(text: str) -> tuple[str, Any]:
    """Split "a.b=value" into ("a.b", parsed value); the value is read as YAML (1e-5, true, [a, b], null)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected section.field=value, got {text!r}")
    value = read_yaml(raw, f"--set {key.strip()}") if raw.strip() else ""
    if isinstance(value, str) and _is_float(raw.strip()):  # YAML 1.1 reads "1e-5" as a string
        value = float(raw)
    return key.strip(), value


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def list_presets() -> list[str]:
    """The names of the shipped presets."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_preset(name: str) -> dict[str, Any]:
    """A preset as a nested dict; `name` is a shipped preset or a path to a YAML file."""
    path = Path(name)
    if not path.is_file():
        path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no preset {name!r}; shipped presets: {', '.join(list_presets())}")
    data = read_yaml(path.read_text(), str(path)) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a preset must be a mapping")
    for key in RECORDS:
        data.pop(key, None)
    return data


def build_config(preset: str | None = "cpu", overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Defaults, then the preset, then `overrides` (a dict of dotted keys to values).

    Switching `env.id` to another family's env (math-* to search-*) drops the preset's `env.kwargs` (options
    of the other env) unless the overrides set some; within a family (search-2agent to search-3agent) they
    are kept, as its envs share their options. Any switch drops the preset's `agents` section (settings of
    the other env's roles: the cpu preset's 8-token math Verifier would cripple search-3agent's Verifier);
    per-agent overrides given with the switch apply.
    """
    data = load_preset(preset) if preset else {}
    overrides = dict(overrides or {})
    env = data.get("env") or {}
    new_id = overrides.get("env.id")
    if new_id is not None and new_id != env.get("id"):
        if _family(new_id) != _family(env.get("id")) and not any(k.startswith("env.kwargs") for k in overrides):
            env.pop("kwargs", None)
        data.pop("agents", None)
    for key, value in (overrides or {}).items():
        nested: dict[str, Any] = {}
        set_dotted(nested, key, value)
        data = _merge(data, nested)
    return from_dict(TrainConfig, data)


def _family(env_id: str | None) -> str | None:
    """The env family of a built-in id ("search-3agent" -> "search"); other ids are their own family."""
    return env_id.rsplit("-", 1)[0] if env_id and env_id.endswith("agent") else env_id


def default_preset(env_id: str | None) -> str:
    """The preset a run without `--preset` starts from: `cpu-search` for the search envs, else `cpu` (math)."""
    return "cpu-search" if _family(env_id) == "search" else "cpu"


RECORDS = ("description", "data_provenance")
"""Top-level keys a preset or a run's config.yaml may carry that are records, not settings: dropped on load."""


def save_config(cfg: TrainConfig, path: str | Path, *, data_provenance: dict[str, Any] | None = None) -> None:
    """Write the resolved config as YAML (loadable again with `--preset <path>`).

    Args:
        cfg: the config.
        path: the file to write.
        data_provenance: where the run's datasets came from (`drmas_envs.dataset_provenance`), written
            after the settings as a record (ignored when the file is loaded again).

    """
    data = to_dict(cfg)
    if data_provenance is not None:
        data["data_provenance"] = data_provenance
    Path(path).write_text(yaml.safe_dump(data, sort_keys=False))
