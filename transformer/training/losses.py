"""Token-level cross-entropy with per-token weights (0 at padding and document boundaries)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def cross_entropy(logits_BTV: jax.Array, targets_BT: jax.Array, weights_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Returns (sum of weighted token losses, sum of weights), both float32 scalars.

    Summing rather than averaging lets eval accumulate exactly over batches and keeps the mean
    over a sharded batch independent of how the batch is split.
    """
    losses_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV.astype(jnp.float32), targets_BT)
    weights_BT = weights_BT.astype(jnp.float32)
    return jnp.sum(losses_BT * weights_BT), jnp.sum(weights_BT)
