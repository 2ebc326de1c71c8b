"""Import a script of the repository (a benchmark, an example) by its path, as a module."""

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(path: str | Path, name: str | None = None) -> ModuleType:
    """The module of the file at `path` (relative to the repository root), registered as `name` (default:
    the file's stem) in `sys.modules`, where dataclasses look their module up."""
    path = ROOT / path
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
