"""Token-level cross-entropy with per-token weights (0 at padding and document boundaries).

Legend: B batch, T sequence, D model width, V vocabulary, C sequence chunks, Bc = (B, chunk) rows.

`cross_entropy` takes materialised logits; `chunked_cross_entropy` (train.loss_chunk_size > 0) takes
the final hidden states and the output head, for large vocabularies where B×T×V float32 logits
would dominate memory.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import optax

from transformer.spec import ConfigError


def cross_entropy(logits_BTV: jax.Array, targets_BT: jax.Array, weights_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Returns (sum of weighted token losses, sum of weights), both float32 scalars.

    Summing rather than averaging lets eval accumulate exactly over batches and keeps the mean
    over a sharded batch independent of how the batch is split.
    """
    losses_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV.astype(jnp.float32), targets_BT)
    weights_BT = weights_BT.astype(jnp.float32)
    return jnp.sum(losses_BT * weights_BT), jnp.sum(weights_BT)


def chunked_cross_entropy(hidden_BTD: jax.Array, logits_fn: Callable[[jax.Array], jax.Array],
                          targets_BT: jax.Array, weights_BT: jax.Array,
                          chunk_size: int) -> tuple[jax.Array, jax.Array]:
    """`cross_entropy(logits_fn(hidden_BTD), ...)` without ever holding all B×T×V logits.

    A scan over sequence chunks of `chunk_size` positions (C = T / chunk_size of them): each computes
    logits_BcV = logits_fn(hidden_BcD) and its weighted loss sum, under jax.checkpoint so that the
    backward pass recomputes one chunk's logits at a time instead of storing them all. Peak logits
    memory is B × chunk_size × V floats instead of B × T × V. Equal to `cross_entropy` up to
    float32 summation order.
    """
    B, T, D = hidden_BTD.shape
    if chunk_size <= 0 or T % chunk_size:
        raise ConfigError(f"train.loss_chunk_size={chunk_size} must be positive and divide the sequence "
                          f"length {T}")
    C = T // chunk_size
    hidden_CBcD = hidden_BTD.reshape(B, C, chunk_size, D).swapaxes(0, 1)
    targets_CBc = targets_BT.reshape(B, C, chunk_size).swapaxes(0, 1)
    weights_CBc = weights_BT.reshape(B, C, chunk_size).swapaxes(0, 1)

    @jax.checkpoint
    def chunk_loss(h_BcD: jax.Array, t_Bc: jax.Array, w_Bc: jax.Array) -> tuple[jax.Array, jax.Array]:
        return cross_entropy(logits_fn(h_BcD), t_Bc, w_Bc)

    def body(carry: tuple[jax.Array, jax.Array], xs: tuple) -> tuple[tuple[jax.Array, jax.Array], None]:
        loss_sum, weight_sum = chunk_loss(*xs)
        return (carry[0] + loss_sum, carry[1] + weight_sum), None

    zero = jnp.zeros((), jnp.float32)
    (loss_sum, weight_sum), _ = jax.lax.scan(body, (zero, zero), (hidden_CBcD, targets_CBc, weights_CBc))
    return loss_sum, weight_sum
