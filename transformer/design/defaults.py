"""Every key a sweep config's `sweep` section may have, with its default: the fields of design/spec.py's SweepSpec
(the one source of them), as a plain dict for configs/sweeps/*.py (which wrap it in a ConfigDict)."""
from __future__ import annotations

from transformer.design.spec import MODES, PARAM_COUNTS, sweep_defaults

__all__ = ["MODES", "PARAM_COUNTS", "sweep_defaults"]
