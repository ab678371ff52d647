"""The import graph of ``src/mor``, read with ``ast`` (nothing is imported or run).

Every ``import`` / ``from ... import`` counts, at module level or inside a function, and an
import of ``a.b.c`` also runs the ``__init__`` of ``a`` and ``a.b``, so those are edges too.
``tests/unit/test_import_layers.py`` holds the layering rules against it; run this file to print
the package graph (which package imports which):

    .venv/bin/python tests/helpers/import_graph.py            # package -> packages it imports
    .venv/bin/python tests/helpers/import_graph.py --modules  # module -> modules
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

if not __package__:  # run as a script (python tests/helpers/import_graph.py): the helpers package is one folder up
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from helpers.paths import SRC  # noqa: E402


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(src: Path = SRC, root: str = "mor") -> dict[str, Path]:
    """Every module of the package ``root``: dotted name -> file."""
    return {module_name(p, src): p for p in sorted((src / root).rglob("*.py"))}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` names (``mor.x.y.func`` -> ``mor.x.y``)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _with_parents(name: str, importer: str, known: dict[str, Path]) -> list[str]:
    """Importing ``a.b.c`` runs ``a/__init__``, ``a.b/__init__`` and ``a.b.c``.

    The importer's own ancestor packages are left out of the implicit parents: Python has
    started them before the importer runs, so ``mor.engine.engine`` importing
    ``mor.engine.scheduler`` does not re-enter ``mor/engine/__init__``. An explicit import of
    an ancestor (``from mor.engine import Request``) still counts: it needs that ``__init__``.
    """
    parts = name.split(".")
    own = {".".join(importer.split(".")[:i]) for i in range(1, importer.count(".") + 2)}
    implicit = [".".join(parts[:i]) for i in range(1, len(parts))]
    return [m for m in implicit if m in known and m not in own] + ([name] if name in known else [])


def imports_of(mod: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported module, line) for every import in ``path``, function-level ones included."""
    is_pkg = path.name == "__init__.py"
    package = mod if is_pkg else mod.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import name``: a submodule (pkg runs as its parent), or an attribute
            # of pkg, which needs pkg's __init__ to have run
            subs = [f"{base}.{a.name}" for a in node.names]
            targets = subs + ([base] if any(t not in known for t in subs) else [])
        for t in targets:
            hit = _resolve(t, known)
            if hit is None:
                continue
            for m in _with_parents(hit, mod, known):
                if m != mod:
                    out.append((m, node.lineno))
    return out


def graph(src: Path = SRC, root: str = "mor") -> dict[str, dict[str, int]]:
    """module -> {imported module: first line that imports it}."""
    known = modules(src, root)
    g: dict[str, dict[str, int]] = {}
    for mod, path in known.items():
        edges: dict[str, int] = {}
        for target, line in imports_of(mod, path, known):
            edges.setdefault(target, line)
        g[mod] = edges
    return g


def find_cycle(g: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle of ``g`` as [a, b, ..., a], or None (iterative DFS, colours)."""
    colour = {m: 0 for m in g}
    for start in sorted(g):
        if colour[start]:
            continue
        stack = [(start, iter(sorted(g[start])))]
        path = [start]
        colour[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour.get(nxt, 2) == 1:
                return path[path.index(nxt):] + [nxt]
            elif colour.get(nxt) == 0:
                colour[nxt] = 1
                stack.append((nxt, iter(sorted(g[nxt]))))
                path.append(nxt)
    return None


def package_of(mod: str, depth: int = 2) -> str:
    return ".".join(mod.split(".")[:depth])


def package_graph(g: dict[str, dict[str, int]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for mod, edges in g.items():
        pkg = package_of(mod)
        out.setdefault(pkg, set()).update(package_of(t) for t in edges if package_of(t) != pkg)
    return out


def main(argv: list[str]) -> int:
    g = graph()
    if "--modules" in argv:
        for mod in sorted(g):
            print(f"{mod} -> {', '.join(sorted(g[mod])) or '-'}")
    else:
        for pkg, deps in sorted(package_graph(g).items()):
            print(f"{pkg} -> {', '.join(sorted(deps)) or '-'}")
    cycle = find_cycle(g)
    print("module cycle: " + (" -> ".join(cycle) if cycle else "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
