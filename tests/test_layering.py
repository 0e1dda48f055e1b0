"""The import rules of docs/design.md ("Dependencies point one way"), checked on every file under transformer/ and
configs/, imports inside functions included: which packages each package may read, no library module importing
configs/ or experiments/, and no import cycle between the files of any package."""
from __future__ import annotations

import os

import pytest

from import_graph import find_cycle, imported_modules, package_graph

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = os.path.join(REPO, "transformer")
LEAVES = {"files", "file_claims", "environment"}  # transformer/{files,file_claims,environment}.py: standard library only, read by any layer
# The picture in docs/design.md: the packages of transformer/ each package may import (besides itself and LEAVES).
MAY_READ = {
    "spec": set(),
    "layers": {"spec"},
    "models": {"spec", "layers"},
    "tasks": {"spec", "data", "models"},
    "training": {"spec", "data", "layers", "models", "tasks"},
    "sweeps": {"spec", "data", "training", "design", "scaling"},
    "data": {"spec"},
    "scaling": {"spec"},
    "design": {"spec", "scaling"},
    "inference": {"spec", "data"},
    "interop": {"spec", "data", "layers", "models", "tasks", "training", "inference"},
}
# design reaches further in two named places, inside functions (docs/design.md): a tokenizer's vocabulary and the
# registry names; sweeps in one: the attention implementation a run will get, for its memory estimate (packing.py).
EXCEPTIONS = {"design": {"transformer.data.tokenizers", "transformer.models.resolve"},
              "sweeps": {"transformer.models.resolve"}}
CONFIGS_MAY_READ = {"spec", "data", "design"}


def _files(top: str):
    for root, _, names in os.walk(top):
        for name in sorted(names):
            if name.endswith(".py"):
                yield os.path.join(root, name)


def _violations(path: str, package: str | None, allowed: set[str]) -> list[str]:
    """The imports of `path` (a file of `package`, None for a leaf module) outside what it may read."""
    bad = []
    for module in sorted(imported_modules(path)):
        parts = module.split(".")
        if parts[0] in ("configs", "experiments"):
            bad.append(module)
        elif parts[0] == "transformer" and len(parts) > 1 and parts[1] != package and parts[1] not in allowed:
            named = EXCEPTIONS.get(package or "", set())  # `from a import b` names a and a.b: a, b or a name in b
            if not any(module == e or e.startswith(module + ".") or module.startswith(e + ".") for e in named):
                bad.append(module)
    return bad


def test_every_package_is_in_the_picture():
    packages = {d for d in os.listdir(LIBRARY) if os.path.isfile(os.path.join(LIBRARY, d, "__init__.py"))}
    assert packages == set(MAY_READ), "a package is missing from MAY_READ (and from docs/design.md's picture)"


@pytest.mark.parametrize("package", sorted(MAY_READ))
def test_imports_point_one_way(package):
    offenders = {os.path.relpath(p, REPO): bad for p in _files(os.path.join(LIBRARY, package))
                 if (bad := _violations(p, package, MAY_READ[package] | LEAVES))}
    assert not offenders, f"imports against docs/design.md's layering: {offenders}"


def test_the_leaf_modules_import_nothing_of_the_package():
    for leaf in sorted(LEAVES):
        bad = [m for m in imported_modules(os.path.join(LIBRARY, f"{leaf}.py"))
               if m.split(".")[0] in ("transformer", "configs", "experiments")]
        assert not bad, (leaf, bad)


def test_configs_read_only_spec_data_and_design():
    offenders = {os.path.relpath(p, REPO): bad for p in _files(os.path.join(REPO, "configs"))
                 if (bad := [m for m in imported_modules(p)
                             if m.split(".")[0] == "experiments" or (m.startswith("transformer.") and
                                                                     m.split(".")[1] not in CONFIGS_MAY_READ)])}
    assert not offenders, offenders


@pytest.mark.parametrize("package", sorted(MAY_READ))
def test_no_import_cycle_between_the_files_of_a_package(package):
    graph = package_graph(os.path.join(LIBRARY, package), f"transformer.{package}")
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle in transformer/{package}: {' -> '.join(cycle)}: move the shared " \
                          "definition down into a module both can import"
