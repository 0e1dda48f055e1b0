"""Helpers shared by the attention tests (tests/test_attention_dispatch.py, tests/test_gpu.py): random
q/k/v, an implementation's loss and gradients, the largest difference of two trees, and decoding token by
token through a MultiHeadAttention's key/value cache."""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from transformer.layers.sdpa import dot_product_attention


def qkv(T: int, K: int, dtype: Any, *, N: int, H: int, seed: int = 0, B: int = 2) -> tuple[jax.Array, ...]:
    """q_BTNH and k_BTKH, v_BTKH, standard normal, in `dtype`."""
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(B, T, N, H)), dtype)
    k, v = (jnp.asarray(rng.normal(size=(B, T, K, H)), dtype) for _ in range(2))
    return q, k, v


def value_and_grads(impl: str, q: jax.Array, k: jax.Array, v: jax.Array, **kw: Any) -> tuple[jax.Array, tuple]:
    """sum(sin(attention)) through implementation `impl`, and its gradients in q, k, v (jitted)."""
    def loss(q, k, v):
        return jnp.sum(jnp.sin(dot_product_attention(q, k, v, implementation=impl, **kw).astype(jnp.float32)))
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)


def max_err(got: Any, want: Any) -> float:
    """The largest |got - want| over the leaves of two trees, in float32."""
    return max(float(jnp.max(jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32))))
               for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))


def decode_in_steps(mha: Any, params: dict, cache: dict, x_BTD: jax.Array, pos_BT: jax.Array,
                    prefill: int) -> jax.Array:
    """From an empty `cache` (mha.init(..., decode=True)["cache"]): the first `prefill` tokens at once, then one
    token per call; the outputs concatenated, (B, T, D)."""
    step = functools.partial(mha.apply, decode=True, mutable=["cache"])
    out, mut = step({**params, "cache": cache}, x_BTD[:, :prefill], pos_BT[:, :prefill])
    outs = [out]
    for t in range(prefill, x_BTD.shape[1]):
        out, mut = step({**params, "cache": mut["cache"]}, x_BTD[:, t:t + 1], pos_BT[:, t:t + 1])
        outs.append(out)
    return jnp.concatenate(outs, axis=1)
