"""Importing a command-line module (experiments/*.py) inside a test process.

Each command line defines its absl flags when imported, as absl programs do; pytest-xdist runs many tests in one
process, so two such modules defining the same flag name (--config, --out, --workdir) collide with absl's
DuplicateFlagError. `cli_module` drops the earlier definition and imports again: tests call these modules'
functions, never their parsed flags."""
from __future__ import annotations

import importlib
import re
import sys
from types import ModuleType

from absl import flags


def cli_module(name: str) -> ModuleType:
    """experiments.NAME (or a dotted name), imported whatever other command lines this process imported before."""
    name = name if "." in name else f"experiments.{name}"
    for _ in range(50):
        if name in sys.modules:
            return sys.modules[name]
        before = set(flags.FLAGS)
        try:
            return importlib.import_module(name)
        except flags.DuplicateFlagError as e:
            # the colliding earlier flag, and those the failed import defined before it (defined again next time)
            flag = re.search(r"The flag '([^']+)' is defined twice", str(e)).group(1)
            for added in {flag} | (set(flags.FLAGS) - before):
                delattr(flags.FLAGS, added)
    raise RuntimeError(f"{name}: its flags kept colliding")
