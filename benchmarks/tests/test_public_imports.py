"""The benchmarks are a client of the library like any other: no `sys.path` edits, only public names."""

import ast
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1]
LIBRARY = ("drmas_envs", "drmas_train", "drmas_retrieval")


def private_uses(source: str) -> list[str]:
    """`sys.path` edits, and imports of a private name or module of the library, in one file's source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "path" and ast.unparse(node.value) == "sys":
            found.append(f"line {node.lineno}: sys.path")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in LIBRARY:
            names = [*node.module.split("."), *(a.name for a in node.names)]
            found += [f"line {node.lineno}: {node.module}.{n}" for n in names if n.startswith("_")]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in LIBRARY and any(p.startswith("_") for p in parts):
                    found.append(f"line {node.lineno}: {alias.name}")
    return sorted(found, key=lambda f: int(f.split(":")[0].split()[1]))


def test_the_finder_sees_path_edits_and_private_names():
    src = "import sys\nsys.path.insert(0, 'x')\nfrom drmas_envs.search.retrievers.dense import _load\n"
    src += "import drmas_train._x\nfrom numpy import _private\nfrom drmas_train.config import TrainConfig\n"
    assert private_uses(src) == [
        "line 2: sys.path",
        "line 3: drmas_envs.search.retrievers.dense._load",
        "line 4: drmas_train._x",
    ]


@pytest.mark.parametrize("path", sorted(BENCHMARKS.rglob("*.py")), ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_no_benchmark_edits_sys_path_or_imports_private_names(path):
    if ".venv" in path.parts or path.name == "test_public_imports.py":
        return
    assert private_uses(path.read_text()) == []
