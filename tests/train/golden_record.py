"""The recorded `--print-config` of every shipped preset, kept as one file: every field once, then each
preset's differences.

`golden/print_config.yaml` holds `defaults` (the whole config of a bare `TrainConfig()`, every field with
its default), `agent_defaults` (a bare `AgentOverrides()`: every per-agent field) and `presets` (for each
preset, the dotted keys whose value differs from the default; its `agents` hold each agent's fields that
differ from `agent_defaults`). A
dotted key reaches into nested sections; where a preset's mapping has other keys than the default's
(an open mapping such as `env.kwargs` or `agents`), the key names the whole mapping and its value
replaces it, so key order is kept. `expected(preset)` rebuilds what `drmas-train --preset P
--print-config` prints, byte for byte, with PyYAML's own dump (not the project's), so a change in how
the project prints shows here too.

A new config field, per-agent ones included, changes this record in one line (its default) plus one line
per preset that sets it.
To record a change that is meant: `python tests/train/golden_record.py` (rewrites the file from today's
output of every preset).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

RECORD = Path(__file__).parent / "golden" / "print_config.yaml"
HEADER = (
    "# What `drmas-train --preset P --print-config` prints for every shipped preset (tests/train/golden_record.py).\n"
    "# defaults: every field of a bare TrainConfig(); presets: each preset's dotted keys that differ from it.\n"
    "# Re-record a meant change with `python tests/train/golden_record.py`.\n"
)


def render(config: dict[str, Any]) -> str:
    """The text `--print-config` prints for a config dict (its trailing newline from print included)."""
    return yaml.safe_dump(config, sort_keys=False) + "\n"


def differences(default: Any, value: Any, prefix: str = "") -> dict[str, Any]:
    """The dotted keys at which `value` differs from `default` (a mapping of other keys is replaced whole)."""
    if isinstance(default, dict) and isinstance(value, dict) and list(default) == list(value):
        out: dict[str, Any] = {}
        for key in default:
            out.update(differences(default[key], value[key], f"{prefix}{key}."))
        return out
    return {} if default == value and type(default) is type(value) else {prefix[:-1]: value}


def apply(default: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`default` with each dotted key of `changes` set (a deep copy; `default` is untouched)."""
    out = yaml.safe_load(yaml.safe_dump(default, sort_keys=False))
    for dotted, value in changes.items():
        *path, last = dotted.split(".")
        node = out
        for key in path:
            node = node[key]
        if last not in node:
            raise KeyError(f"the record's key {dotted!r} names no field of the defaults")
        node[last] = value
    return out


def load() -> dict[str, Any]:
    """The record: {"defaults": {...}, "agent_defaults": {...}, "presets": {name: {dotted key: value}}}."""
    return yaml.safe_load(RECORD.read_text())


def expected(preset: str, record: dict[str, Any] | None = None) -> str:
    """What `drmas-train --preset <preset> --print-config` should print, rebuilt from the record."""
    record = record or load()
    config = apply(record["defaults"], record["presets"][preset] or {})
    config["agents"] = {name: apply(record["agent_defaults"], agent) for name, agent in config["agents"].items()}
    return render(config)


def record_now() -> str:
    """The record's text from today's output of every shipped preset."""
    from drmas_train.config import AgentOverrides, TrainConfig, build_config, list_presets, to_dict

    defaults, agent_defaults = to_dict(TrainConfig()), to_dict(AgentOverrides())
    presets = {}
    for name in list_presets():
        config = to_dict(build_config(name, {}))
        config["agents"] = {agent: differences(agent_defaults, v) for agent, v in config["agents"].items()}
        presets[name] = differences(defaults, config)
    record = {"defaults": defaults, "agent_defaults": agent_defaults, "presets": presets}
    body = yaml.safe_dump(record, sort_keys=False)
    return HEADER + body


if __name__ == "__main__":
    RECORD.write_text(record_now())
    print(f"recorded {RECORD}")
