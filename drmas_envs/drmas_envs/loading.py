"""Envs that live outside this package: `package.module:factory` references and installed entry points.

A *target* (what a reference names) is one of:

- a callable returning a PettingZoo AEC env (a factory function, an `AECEnv` subclass), called with
  `make`'s keyword arguments;
- a `Workflow` subclass, which becomes `WorkflowEnv(cls, tasks, **kwargs)`; its tasks come from
  `tasks=[{...}, ...]` or `dataset="tasks.jsonl"` (one JSON object per line).

An installed package makes its workflows reachable by id through the `drmas_envs.envs` entry-point
group, in its pyproject.toml:

    [project.entry-points."drmas_envs.envs"]
    math-debate = "my_team.debate:debate_env"
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pettingzoo import AECEnv

from drmas_envs.data import read_jsonl
from drmas_envs.env import WorkflowEnv
from drmas_envs.workflow import Workflow

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "drmas_envs.envs"
"""The entry-point group an installed package lists its envs in (name: env id, value: "module:attr")."""


class EnvNotFoundError(KeyError):
    """An env reference that names nothing: an unknown id, a missing module or attribute, a wrong kind."""

    def __str__(self) -> str:
        # KeyError's str() quotes its message; this one is read by people.
        return str(self.args[0]) if self.args else ""


def is_reference(env_id: str) -> bool:
    """Whether `env_id` is a `package.module:attribute` reference rather than an id."""
    return ":" in env_id


def load_reference(reference: str) -> Callable[..., AECEnv]:
    """The env factory that `package.module:attribute` names.

    Raises:
        EnvNotFoundError: the reference is malformed, its module cannot be imported, the module lacks
            the attribute, or the attribute is neither a callable nor a `Workflow` subclass.

    """
    module_name, _, attr = reference.partition(":")
    if not module_name or not attr:
        raise EnvNotFoundError(f"env {reference!r}: expected 'package.module:factory'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise EnvNotFoundError(
                f"env {reference!r}: no module named {module_name!r} (install its package or put it on PYTHONPATH)"
            ) from None
        raise EnvNotFoundError(f"env {reference!r}: importing {module_name} failed: {exc}") from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise EnvNotFoundError(f"env {reference!r}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    return env_factory(target, reference)


def env_factory(target: Any, where: str) -> Callable[..., AECEnv]:
    """A `(**kwargs) -> AECEnv` callable for `target` (see the module docstring); `where` names it in errors."""
    if isinstance(target, type) and issubclass(target, Workflow):
        return functools.partial(workflow_env, target)
    if not callable(target):
        raise EnvNotFoundError(
            f"env {where!r}: a {type(target).__name__} is neither a callable returning an AEC env "
            "nor a Workflow subclass"
        )

    @functools.wraps(target)
    def build(**kwargs: Any) -> AECEnv:
        env = target(**kwargs)
        if not isinstance(env, AECEnv):
            raise TypeError(f"env {where!r} returned a {type(env).__name__}, not a PettingZoo AECEnv")
        return env

    return build


def workflow_env(
    workflow: type[Workflow],
    *,
    tasks: Sequence[Mapping[str, Any]] | None = None,
    dataset: str | None = None,
    **kwargs: Any,
) -> WorkflowEnv:
    """`WorkflowEnv(workflow, tasks, **kwargs)`, the tasks given as a list or as a JSONL file.

    Raises:
        ValueError: neither or both of `tasks` and `dataset` were given.

    """
    if (tasks is None) == (dataset is None):
        raise ValueError(
            f"{workflow.__name__} is a Workflow: give its tasks, as tasks=[...] or dataset='tasks.jsonl' "
            "(from drmas-train: --set env.kwargs.dataset=tasks.jsonl)"
        )
    return WorkflowEnv(workflow, read_jsonl(dataset) if dataset is not None else tasks, **kwargs)


def entry_point_envs() -> dict[str, tuple[str, str]]:
    """The installed packages' envs: id -> ("module:attr", the package that declares it)."""
    found: dict[str, tuple[str, str]] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        package = dist.metadata["Name"] if dist is not None else "an installed package"
        if ep.name in found and found[ep.name][0] != ep.value:
            log.warning("env id %r is declared twice (%s, %s); using the first", ep.name, found[ep.name][0], ep.value)
            continue
        found.setdefault(ep.name, (ep.value, package))
    return found
