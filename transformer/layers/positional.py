"""Position information: sinusoidal (Vaswani et al. 2017), learned absolute, rotary (RoPE).

Legend: B batch, T sequence, D model width, N heads, H head dimension.

`none` needs no code: the model simply adds nothing (causal masking alone leaks some position).
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp


def sinusoidal_table(positions: jnp.ndarray, d: int, base: float = 10000.0) -> jnp.ndarray:
    """Sinusoidal embeddings of `positions` (any shape P) -> P + (d,), float32.

    PE[p, 2i] = sin(p / base^(2i/d)),  PE[p, 2i+1] = cos(p / base^(2i/d))  (interleaved, as in the paper).
    """
    if d % 2:
        raise ValueError(f"sinusoidal positions need an even width, got d={d}")
    inv_freq_F = 1.0 / (base ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq_F       # P + (d/2,)
    table = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)         # P + (d/2, 2)
    return table.reshape(*positions.shape, d)


class LearnedPositions(nn.Module):
    """A learned absolute position table ("seq", "embed"), looked up by position."""

    max_len: int
    d_model: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, positions_BT: jnp.ndarray) -> jnp.ndarray:
        table_LD = self.param(
            "embedding", nn.with_logical_partitioning(nn.initializers.normal(0.02), ("seq", "embed")),
            (self.max_len, self.d_model), self.param_dtype)
        return jnp.take(table_LD, positions_BT, axis=0).astype(self.dtype)   # B,T,D


def _rotate_half(x: jnp.ndarray) -> jnp.ndarray:
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([-x2, x1], axis=-1)


def apply_rope(x_BTNH: jnp.ndarray, positions_BT: jnp.ndarray, base: float = 10000.0) -> jnp.ndarray:
    """Rotary position embedding (Su et al. 2021), rotate-half convention as HF LLaMA.

    Dimension pairs are (i, i + H/2); pair i turns by angle position * base^(-2i/H). Computed in
    float32, returned in x's dtype. Rotated q·k then depends on positions only through their offset.
    """
    H = x_BTNH.shape[-1]
    if H % 2:
        raise ValueError(f"RoPE needs an even head dimension, got H={H}")
    inv_freq = 1.0 / (base ** (jnp.arange(0, H, 2, dtype=jnp.float32) / H))   # H/2
    angles_BTh = positions_BT.astype(jnp.float32)[..., None] * inv_freq
    angles_BT1H = jnp.concatenate([angles_BTh, angles_BTh], axis=-1)[:, :, None, :]
    x = x_BTNH.astype(jnp.float32)
    out = x * jnp.cos(angles_BT1H) + _rotate_half(x) * jnp.sin(angles_BT1H)
    return out.astype(x_BTNH.dtype)
