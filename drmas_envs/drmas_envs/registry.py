"""The env registry: `make`, `list_envs`, `register`, mirrored into PettingZoo's own registry.

Ids are short names (`math-2agent`); PettingZoo sees them as `drmas/<name>-v0`. Entry points are
"module:attribute" strings, imported on first use, so `import drmas_envs` stays light.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pettingzoo
from pettingzoo import AECEnv

NAMESPACE = "drmas"
VERSION = 0


@dataclass(frozen=True)
class EnvSpec:
    """How to build one registered env: an entry point and its default keyword arguments."""

    id: str
    entry_point: str | Callable[..., AECEnv]
    kwargs: dict[str, Any] = field(default_factory=dict)
    description: str = ""

    def load(self) -> Callable[..., AECEnv]:
        """The callable behind `entry_point`."""
        if callable(self.entry_point):
            return self.entry_point
        module, _, attr = self.entry_point.partition(":")
        return getattr(importlib.import_module(module), attr)


_REGISTRY: dict[str, EnvSpec] = {}
_ID = re.compile(rf"^(?:{NAMESPACE}/)?(?P<name>[A-Za-z0-9_.\-]+?)(?:-v(?P<version>\d+))?$")


def _canonical(env_id: str) -> str:
    match = _ID.match(env_id)
    return match.group("name") if match else env_id


def register(env_id: str, entry_point: str | Callable[..., AECEnv], *, description: str = "", **kwargs: Any) -> None:
    """Register an env under `env_id` here and as `drmas/<env_id>-v0` in PettingZoo's registry.

    Args:
        env_id: the short id, e.g. "math-2agent".
        entry_point: a callable returning an AEC env, or a "module:attribute" string naming one.
        description: one line for `list_envs(verbose=True)` and the CLI.
        **kwargs: default keyword arguments; `make` overrides them.

    """
    spec = EnvSpec(env_id, entry_point, dict(kwargs), description)
    _REGISTRY[env_id] = spec
    pettingzoo.register("aec", f"{NAMESPACE}/{env_id}-v{VERSION}", entry_point=lambda **kw: make(env_id, **kw))


def make(env_id: str, **kwargs: Any) -> AECEnv:
    """Build a registered env.

    Args:
        env_id: "math-2agent", or its PettingZoo form "drmas/math-2agent-v0".
        **kwargs: override the registered defaults (dataset, split, format_penalty, prompts, ...).

    Raises:
        KeyError: the id is unknown; the message lists the known ids.

    """
    name = _canonical(env_id)
    if name not in _REGISTRY:
        raise KeyError(f"unknown env id {env_id!r}; known ids: {', '.join(list_envs())}")
    spec = _REGISTRY[name]
    return spec.load()(**{**spec.kwargs, **kwargs})


def list_envs(verbose: bool = False) -> list[str]:
    """The registered env ids, sorted; with `verbose`, as "id: description" lines."""
    ids = sorted(_REGISTRY)
    return [f"{i}: {_REGISTRY[i].description}" for i in ids] if verbose else ids


def spec(env_id: str) -> EnvSpec:
    """The registration of `env_id`."""
    name = _canonical(env_id)
    if name not in _REGISTRY:
        raise KeyError(f"unknown env id {env_id!r}; known ids: {', '.join(list_envs())}")
    return _REGISTRY[name]
