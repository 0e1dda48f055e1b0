"""LayerNorm and RMSNorm with logically partitioned parameters ("norm",).

Statistics are computed in float32 (flax's default) whatever the compute dtype.
"""
from __future__ import annotations

import flax.linen as nn

from transformer.layers.dtypes import compute_dtypes
from transformer.models.config import ModelConfig


def make_norm(cfg: ModelConfig, name: str) -> nn.Module:
    """The config's norm: LayerNorm (scale, plus a bias when cfg.use_bias) or RMSNorm (scale only)."""
    dtype, param_dtype = compute_dtypes(cfg)
    scale_init = nn.with_logical_partitioning(nn.initializers.ones, ("norm",))
    if cfg.norm == "layernorm":
        return nn.LayerNorm(epsilon=cfg.norm_eps, use_bias=cfg.use_bias, dtype=dtype, param_dtype=param_dtype,
                            scale_init=scale_init,
                            bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("norm",)),
                            name=name)
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(epsilon=cfg.norm_eps, dtype=dtype, param_dtype=param_dtype, scale_init=scale_init,
                          name=name)
    raise ValueError(f"model.norm={cfg.norm!r} is not valid; choose one of layernorm, rmsnorm")
