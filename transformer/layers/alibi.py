"""ALiBi, attention with linear biases (Press et al. 2022, "Train Short, Test Long"): `model.positional=alibi`.

Legend: N heads, T queries, S keys.

No position embedding: every self-attention layer adds -m_n · distance to head n's logits, distance being
query slot − key slot (slots: see transformer/layers/positional.py). The slopes m_n are a geometric
sequence fixed before training:
  N a power of two:  m_n = 2^(-8(n+1)/N), n = 0..N-1   (8 heads: 1/2, 1/4, ..., 1/256)
  otherwise:         the N' = 2^floor(log2 N) slopes of N', then every other slope of 2N' (1st, 3rd, ...)
                     until there are N (the paper's code; BLOOM's build_alibi_tensor does the same).
Causal stacks (decoders; the paper's setting): bias = -m · (i − j) for query i and key j ≤ i (keys after
the query are masked anyway). Bidirectional stacks (encoders; not in the paper): -m · |i − j|, the
symmetric form MosaicBERT uses (Portes et al. 2023). Cross-attention gets no bias. The bias grows
linearly with distance and never saturates, which is what lets a model run past its training length.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def alibi_slopes(num_heads: int) -> np.ndarray:
    """The N per-head slopes m_n, float32, largest first."""
    if num_heads <= 0:
        raise ValueError(f"ALiBi needs at least one head, got {num_heads}")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if num_heads & (num_heads - 1) == 0:
        return np.asarray(power_of_two(num_heads), np.float32)
    closest = 2 ** int(math.floor(math.log2(num_heads)))
    extra = power_of_two(2 * closest)[0::2][:num_heads - closest]
    return np.asarray(power_of_two(closest) + extra, np.float32)


def alibi_bias(cfg: Any, q_slots_T: jax.Array, k_slots_S: jax.Array, causal: bool) -> jax.Array:
    """bias_1NTS (float32): -m_n · (i − j) (causal) or -m_n · |i − j| (bidirectional)."""
    distance_TS = (q_slots_T[:, None] - k_slots_S[None, :]).astype(jnp.float32)
    if not causal:
        distance_TS = jnp.abs(distance_TS)
    slopes_N11 = jnp.asarray(alibi_slopes(cfg.num_heads))[:, None, None]
    return (-slopes_N11 * distance_TS)[None]
