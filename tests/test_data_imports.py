"""The data package's modules import one another one way: no cycle, also through imports inside functions."""
from __future__ import annotations

import ast
import os

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "transformer", "data")


def _imports(path: str) -> set[str]:
    """transformer.data modules imported anywhere in the file (module level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "transformer.data":
                found |= {f"transformer.data.{a.name}" for a in node.names}
            elif node.module.startswith("transformer.data."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("transformer.data.")}
    return found


def test_no_import_cycle_between_data_modules():
    graph = {f"transformer.data.{f[:-3]}": _imports(os.path.join(DATA, f))
             for f in os.listdir(DATA) if f.endswith(".py") and f != "__init__.py"}
    graph = {m: {d for d in deps if d in graph and d != m} for m, deps in graph.items()}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(d == goal or (d not in seen and reaches(d, goal, seen | {d})) for d in graph[start])

    cycles = sorted(m for m in graph if reaches(m, m, {m}))
    assert not cycles, f"import cycles through {cycles}: move the shared definition down (e.g. into packed.py)"
