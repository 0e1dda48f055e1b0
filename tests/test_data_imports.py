"""The data package's modules import one another one way: no cycle, also through imports inside functions."""
from __future__ import annotations

import os

from import_graph import find_cycle, package_graph

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "transformer", "data")


def test_no_import_cycle_between_data_modules():
    graph = package_graph(DATA, "transformer.data")
    assert {"packed", "pipeline"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle {' -> '.join(cycle)}: move the shared definition down (e.g. into packed.py)"
