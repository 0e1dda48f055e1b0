"""The sweep package's modules import one another one way (issue 19: no import cycles between files, imports
inside functions included); before, runner.py imported run_groups inside a function and run_groups imported
runner."""
from __future__ import annotations

import ast
import os

import transformer.sweeps

SWEEPS = os.path.dirname(transformer.sweeps.__file__)


def _imports(path: str) -> set[str]:
    """The transformer.sweeps modules that the file at `path` imports, anywhere in it."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n.split(".")[2] for n in names if n.startswith("transformer.sweeps.") and n.count(".") >= 2}
    return out


def test_the_sweep_modules_import_each_other_without_a_cycle():
    graph = {f[:-3]: _imports(os.path.join(SWEEPS, f)) - {f[:-3]}
             for f in os.listdir(SWEEPS) if f.endswith(".py") and f != "__init__.py"}
    assert {"runner", "run_groups"} <= set(graph)
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            raise AssertionError(f"import cycle: {' -> '.join(path[path.index(node):] + [node])}")
        if node in done or node not in graph:
            return
        for nxt in sorted(graph[node]):
            visit(nxt, path + [node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
