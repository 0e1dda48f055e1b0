"""Model initialisation for tests, compiled with a key that is cheap to compile.

A small model's `init` is dominated by its random numbers: eagerly, every parameter shape compiles its own
threefry kernels; under `jax.jit`, the threefry rounds of every parameter make a large program. A key of
XLA's RngBitGenerator (`impl="unsafe_rbg"`) draws the same distributions from a single cheap op, so the
compiled init takes about a third of the time. For tests whose parameters are arbitrary, not for training.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax


def init_variables(model: nn.Module, *args: Any, seed: int = 0, **kwargs: Any) -> dict:
    """`model.init(key, *args, **kwargs)`, unboxed, compiled once, from an RngBitGenerator key of `seed`."""
    return jax.jit(lambda key: nn.unbox(model.init(key, *args, **kwargs)))(jax.random.key(seed, impl="unsafe_rbg"))
