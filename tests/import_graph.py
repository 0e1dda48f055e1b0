"""What a Python file imports, read from its syntax tree (imports inside functions too), and the import graph
between the modules of one package: the one scanner the import-rule tests share."""
from __future__ import annotations

import ast
import os


def imported_modules(path: str) -> set[str]:
    """Every module an import statement in the file names: `import a.b` gives a.b; `from a import b, c` gives a,
    a.b and a.c (b may be a submodule). Relative imports are not resolved (the project uses absolute ones)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def package_graph(package_dir: str, package: str) -> dict[str, set[str]]:
    """{module: the package's other modules it imports}, by short name ("packed"), for the .py files of
    `package_dir` (`package` is its dotted name, "transformer.data")."""
    modules = {f[:-3] for f in os.listdir(package_dir) if f.endswith(".py") and f != "__init__.py"}
    graph = {}
    for m in modules:
        heads = {n[len(package) + 1:].split(".")[0] for n in imported_modules(os.path.join(package_dir, f"{m}.py"))
                 if n.startswith(package + ".")}
        graph[m] = (heads & modules) - {m}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph` as [a, b, ..., a], or None."""
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for nxt in sorted(graph.get(node, ())):
            cycle = visit(nxt, path + [node])
            if cycle:
                return cycle
        done.add(node)
        return None

    return next((c for c in (visit(n, []) for n in sorted(graph)) if c), None)
