"""The sweep package's modules import one another one way (issue 19: no import cycles between files, imports
inside functions included); before, runner.py imported run_groups inside a function and run_groups imported
runner."""
from __future__ import annotations

import os

import transformer.sweeps
from import_graph import find_cycle, package_graph

SWEEPS = os.path.dirname(transformer.sweeps.__file__)


def test_the_sweep_modules_import_each_other_without_a_cycle():
    graph = package_graph(SWEEPS, "transformer.sweeps")
    assert {"runner", "run_groups"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"
