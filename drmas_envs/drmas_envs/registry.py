"""The env registry: `make`, `list_envs`, `register`, mirrored into PettingZoo's own registry.

Ids are short names (`math-2agent`); PettingZoo sees them as `drmas/<name>-v0`. Entry points are
"module:attribute" strings, imported on first use, so `import drmas_envs` stays light.

`make` also takes what is not registered here (see `drmas_envs.loading`): a `package.module:factory`
reference, and the ids that installed packages declare in the `drmas_envs.envs` entry-point group
(found when an id is missed or the ids are listed, and registered then; built-in ids win a clash).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pettingzoo
from pettingzoo import AECEnv

from drmas_envs.loading import EnvNotFoundError, entry_point_envs, env_factory, is_reference, load_reference
from drmas_envs.provenance import TaskSet

log = logging.getLogger(__name__)

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
        """A `(**kwargs) -> AECEnv` callable for `entry_point` (a factory, or a `Workflow` subclass)."""
        if isinstance(self.entry_point, str):
            return load_reference(self.entry_point)
        return env_factory(self.entry_point, self.id)


_REGISTRY: dict[str, EnvSpec] = {}
_ID = re.compile(rf"^(?:{NAMESPACE}/)?(?P<name>[A-Za-z0-9_.\-]+?)(?:-v(?P<version>\d+))?$")


def _canonical(env_id: str) -> str:
    match = _ID.match(env_id)
    return match.group("name") if match else env_id


def register(env_id: str, entry_point: str | Callable[..., AECEnv], *, description: str = "", **kwargs: Any) -> None:
    """Register an env under `env_id` here and as `drmas/<env_id>-v0` in PettingZoo's registry.

    Args:
        env_id: the short id, e.g. "math-2agent".
        entry_point: a callable returning an AEC env or a `Workflow` subclass (then pass `tasks=` or
            `dataset=`), or a "module:attribute" string naming one.
        description: one line for `list_envs(verbose=True)` and the CLI.
        **kwargs: default keyword arguments; `make` overrides them.

    """
    spec = EnvSpec(env_id, entry_point, dict(kwargs), description)
    _REGISTRY[env_id] = spec
    pettingzoo.register("aec", f"{NAMESPACE}/{env_id}-v{VERSION}", entry_point=lambda **kw: make(env_id, **kw))


def make(env_id: str, **kwargs: Any) -> AECEnv:
    """Build an env: a registered id, an installed package's id, or a `package.module:factory` reference.

    Args:
        env_id: "math-2agent", its PettingZoo form "drmas/math-2agent-v0", an id from the
            `drmas_envs.envs` entry-point group, or "my_team.debate:debate_env" (a callable returning
            an AEC env, or a `Workflow` subclass; see `drmas_envs.loading`).
        **kwargs: override the registered defaults (dataset, split, format_penalty, prompts, ...).

    Raises:
        EnvNotFoundError: (a KeyError) the id is unknown (the message lists the known ids), or the
            reference names a missing module or attribute.

    """
    found = spec(env_id)
    return found.load()(**{**found.kwargs, **kwargs})


def discover_installed() -> None:
    """Register the installed packages' envs not registered yet."""
    for env_id, (value, package) in entry_point_envs().items():
        if env_id in _REGISTRY:
            if _REGISTRY[env_id].entry_point != value:
                log.warning("%s declares env id %r, which is taken; keeping the registered one", package, env_id)
            continue
        register(env_id, value, description=f"{value} (from {package})")


def list_envs(verbose: bool = False) -> list[str]:
    """The registered and installed env ids, sorted; with `verbose`, as "id: description" lines."""
    discover_installed()
    ids = sorted(_REGISTRY)
    return [f"{i}: {_REGISTRY[i].description}" for i in ids] if verbose else ids


def spec(env_id: str) -> EnvSpec:
    """How `env_id` is built: its registration, or a spec for a `module:factory` reference."""
    name = _canonical(env_id)
    if name not in _REGISTRY:
        discover_installed()
    if name in _REGISTRY:
        return _REGISTRY[name]
    if is_reference(env_id):
        return EnvSpec(env_id, env_id)
    raise EnvNotFoundError(
        f"unknown env id {env_id!r}; known ids: {', '.join(list_envs())}; or a 'package.module:factory' reference"
    )


def env_dataset(env_id: str, **kwargs: Any) -> TaskSet | None:
    """The tasks a built-in env would load with these keyword arguments, without building the env.

    A trainer calls it for its train and eval envs before loading a model, so a missing dataset ends
    the run at once (`DatasetNotFoundError`), and writes `.provenance` into the run's config.

    Returns:
        The `TaskSet` (cached; its `provenance` says where it came from), or None for an env that is
        not one of the built-in math or search envs (its data is its own business).

    Raises:
        DatasetNotFoundError: a known dataset is neither local nor reachable (the message says how to fetch it).
        DataError: a malformed file (named by file and line/row).

    """
    found = spec(env_id)
    options = {**found.kwargs, **kwargs}
    if found.entry_point == "drmas_envs.math.env:math_env":
        from drmas_envs.math.env import MathEnvConfig, env_tasks

        return env_tasks(MathEnvConfig(**options))
    if found.entry_point == "drmas_envs.search.env:search_env":
        from drmas_envs.search.data import load_questions

        bad_rows = options.get("bad_rows", "error")
        return load_questions(options.get("dataset"), options.get("split"), options.get("data_dir"), bad_rows)
    return None
