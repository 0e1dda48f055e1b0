"""T5's bucketed relative position bias (Raffel et al. 2020, section 2.1): `model.positional=t5_relative`.

Legend: N heads, T queries, S keys, R buckets (model.relative_num_buckets).

Each stack owns one learned table ("positions", "heads") of R × N scalars. The offset key slot − query
slot (slots: see transformer/layers/positional.py) falls into a bucket, and the bucket's N values are
added to the self-attention logits of every layer of the stack: T5 computes the bias once, in its first
layer, and hands it to the others. (It keeps the table in layer 0's attention; here it sits one level
up, in the stack, so that scanned layers need no special first layer; transformer/interop/hf_t5.py maps
the two.) Cross-attention gets no bias.

Buckets, as Mesh TensorFlow and Hugging Face compute them:
  bidirectional (encoders)  R/2 buckets per direction: keys after the query use the upper half;
  unidirectional (decoders) only keys at or before the query (offset <= 0), all R buckets;
  within a direction, with R' its buckets and d = |offset|: d < R'/2 is a bucket of its own (exact);
  larger d go to R'/2 + floor(log(d / (R'/2)) / log(max_distance / (R'/2)) · R'/2), capped at R' − 1,
  so every d >= model.relative_max_distance shares the last bucket.
The logarithm is taken in float32, as T5 does, so the bucket edges match its checkpoints exactly.
"""
from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.layers.dtypes import compute_dtypes


def relative_position_bucket(relative_TS: jax.Array, *, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> jax.Array:
    """Bucket index (int32, in [0, num_buckets)) of each offset key − query."""
    relative_TS = relative_TS.astype(jnp.int32)
    buckets = jnp.zeros_like(relative_TS)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_TS > 0).astype(jnp.int32) * num_buckets
        distance = jnp.abs(relative_TS)
    else:
        distance = -jnp.minimum(relative_TS, 0)
    max_exact = num_buckets // 2
    # float32 throughout, in T5's order of operations (log(d / max_exact) / log(max_distance / max_exact))
    log_ratio = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact)
    large = max_exact + (log_ratio / np.float32(math.log(max_distance / max_exact))
                         * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return buckets + jnp.where(distance < max_exact, distance, large)


class RelativePositionBias(nn.Module):
    """(q_slots_T, k_slots_S) -> bias_1NTS (float32) looked up in an ("positions", "heads") table."""

    num_buckets: int
    max_distance: int
    num_heads: int
    bidirectional: bool
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, q_slots_T: jax.Array, k_slots_S: jax.Array) -> jax.Array:
        table_RN = self.param(
            "embedding", nn.with_logical_partitioning(nn.initializers.normal(0.02), ("positions", "heads")),
            (self.num_buckets, self.num_heads), self.param_dtype)
        buckets_TS = relative_position_bucket(k_slots_S[None, :] - q_slots_T[:, None],
                                              bidirectional=self.bidirectional, num_buckets=self.num_buckets,
                                              max_distance=self.max_distance)
        values_TSN = jnp.take(table_RN, buckets_TS, axis=0).astype(jnp.float32)
        return jnp.transpose(values_TSN, (2, 0, 1))[None]


def t5_relative_bias(cfg: Any, q_slots_T: jax.Array, k_slots_S: jax.Array, causal: bool) -> jax.Array:
    """The calling stack's table (submodule "relative_position_bias"), unidirectional when causal."""
    _, param_dtype = compute_dtypes(cfg)
    return RelativePositionBias(cfg.relative_num_buckets, cfg.relative_max_distance, cfg.num_heads,
                                bidirectional=not causal, param_dtype=param_dtype,
                                name="relative_position_bias")(q_slots_T, k_slots_S)
