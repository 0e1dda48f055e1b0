"""Position information: sinusoidal (Vaswani et al. 2017), learned absolute, rotary (RoPE), the attention
biases ALiBi (alibi.py) and T5's relative buckets (t5_relative.py), none.

Legend: B batch, T sequence (queries), S keys, D model width, N heads, H head dimension.

Every encoding is registered at the bottom of this file, by the name `model.positional` selects:
  ABSOLUTE  name -> fn(cfg, positions_BT) -> pos_BTD, added to the token embeddings (a function that
            needs parameters creates its Linen submodule inside the calling model);
  ROTARY    name -> fn(cfg, x_BTNH, positions_BT) -> x_BTNH, applied to queries and keys in self-attention;
  BIAS      name -> fn(cfg, q_slots_T, k_slots_S, causal) -> bias_1NTS (float32), added to the
            self-attention logits of every layer; the stack (transformer/models/stack.py) computes it once
            per call and hands it to each layer (a table with parameters is a submodule of the stack);
  "none"    adds nothing (causal masking alone leaks some position).
A bias depends on the offset between key and query *slots*: a token's index in its row, or, when
decoding, its slot in the key/value cache (queries at the cache index onwards). positions_BT does not
enter: it counts up by one within every document of a packed row and every left-padded prompt, so slot
offsets equal position offsets on every pair that attention does not mask, and the bias stays one
(1, N, T, S) array shared by the batch (T5 and Hugging Face compute theirs the same way).
Adding an encoding is a function here and one registry line; ModelConfig validates against the registry.
"""
from __future__ import annotations

from typing import Any, Callable

import flax.linen as nn
import jax.numpy as jnp

from transformer.layers.alibi import alibi_bias
from transformer.layers.t5_relative import t5_relative_bias


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
    """A learned absolute position table ("positions", "embed"), looked up by position."""

    max_len: int
    d_model: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, positions_BT: jnp.ndarray) -> jnp.ndarray:
        table_LD = self.param(
            "embedding", nn.with_logical_partitioning(nn.initializers.normal(0.02), ("positions", "embed")),
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


def _learned(cfg: Any, positions_BT: jnp.ndarray) -> jnp.ndarray:
    from transformer.layers.dtypes import compute_dtypes
    dtype, param_dtype = compute_dtypes(cfg)
    return LearnedPositions(cfg.max_len, cfg.d_model, dtype, param_dtype, name="position_embedding")(positions_BT)


def _sinusoidal(cfg: Any, positions_BT: jnp.ndarray) -> jnp.ndarray:
    return sinusoidal_table(positions_BT, cfg.d_model)


def _rope(cfg: Any, x_BTNH: jnp.ndarray, positions_BT: jnp.ndarray) -> jnp.ndarray:
    return apply_rope(x_BTNH, positions_BT, cfg.rope_base)


ABSOLUTE: dict[str, Callable[[Any, jnp.ndarray], jnp.ndarray]] = {
    "learned": _learned,
    "sinusoidal": _sinusoidal,
}
ROTARY: dict[str, Callable[[Any, jnp.ndarray, jnp.ndarray], jnp.ndarray]] = {
    "rope": _rope,
}
BIAS: dict[str, Callable[[Any, jnp.ndarray, jnp.ndarray, bool], jnp.ndarray]] = {
    "alibi": alibi_bias,
    "t5_relative": t5_relative_bias,
}
POSITIONAL_ENCODINGS = (*ABSOLUTE, *ROTARY, *BIAS, "none")
