"""Config dtype names ("float32", "bfloat16", "float16") as jnp dtypes."""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from transformer.spec import ModelConfig

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def compute_dtypes(cfg: ModelConfig) -> tuple[Any, Any]:
    """(compute dtype, parameter dtype) of a model config."""
    return _DTYPES[cfg.dtype], _DTYPES[cfg.param_dtype]
