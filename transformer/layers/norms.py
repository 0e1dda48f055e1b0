"""LayerNorm and RMSNorm with logically partitioned parameters ("norm",).

Statistics are computed in float32 (flax's default) whatever the compute dtype.
"""
from __future__ import annotations

import flax.linen as nn

from transformer.layers.dtypes import compute_dtypes
from transformer.spec import ModelConfig


_SCALE_INIT = nn.with_logical_partitioning(nn.initializers.ones, ("norm",))


def _layernorm(cfg: ModelConfig, name: str) -> nn.Module:
    dtype, param_dtype = compute_dtypes(cfg)
    return nn.LayerNorm(epsilon=cfg.norm_eps, use_bias=cfg.use_bias, dtype=dtype, param_dtype=param_dtype,
                        scale_init=_SCALE_INIT, bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("norm",)),
                        name=name)


def _rmsnorm(cfg: ModelConfig, name: str) -> nn.Module:
    dtype, param_dtype = compute_dtypes(cfg)
    return nn.RMSNorm(epsilon=cfg.norm_eps, dtype=dtype, param_dtype=param_dtype, scale_init=_SCALE_INIT, name=name)


# `model.norm` selects one by name (checked when a model is built, transformer.models.resolve).
NORMS = {"layernorm": _layernorm, "rmsnorm": _rmsnorm}


def make_norm(cfg: ModelConfig, name: str) -> nn.Module:
    """The config's norm: LayerNorm (scale, plus a bias when cfg.use_bias) or RMSNorm (scale only)."""
    return NORMS[cfg.norm](cfg, name)


def make_head_norm(cfg: ModelConfig, name: str) -> nn.Module:
    """QK-norm (model.qk_norm): RMSNorm over the last axis of x_BTNH, one scale ("head_dim",) of H shared by
    every head (Qwen3, Gemma 3), eps = cfg.norm_eps, whatever cfg.norm is."""
    dtype, param_dtype = compute_dtypes(cfg)
    return nn.RMSNorm(epsilon=cfg.norm_eps, dtype=dtype, param_dtype=param_dtype,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("head_dim",)), name=name)
