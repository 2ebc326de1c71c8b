"""The import graph of the project's packages, read from their source with `ast` (nothing is imported).

Every `import` statement counts, at module level or inside a function: a lazy import still ties two
modules together. `from a.b import c` is an edge to `a.b.c` when that is a module, else to `a.b`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "drmas_envs": ROOT / "drmas_envs" / "drmas_envs",
    "drmas_train": ROOT / "drmas_train" / "drmas_train",
    "drmas_retrieval": ROOT / "retrieval" / "drmas_retrieval",
}


def modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the packages."""
    out = {}
    for name, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [name, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _imported(tree: ast.AST, module: str, is_package: bool, known: dict[str, Path]) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield sub if sub in known else base


def graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (itself excluded)."""
    known = modules()
    edges: dict[str, set[str]] = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = _imported(tree, name, path.name == "__init__.py", known)
        edges[name] = {t for t in targets if t in known and t != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found
