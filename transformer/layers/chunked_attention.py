"""Query-chunked attention with a written-out backward pass ("chunked"): the fast path on CPU.

Legend as in attention.py: B batch, T queries, S keys, N query heads, K key/value heads, G = N // K,
H head dim; C query chunks.

Two changes over differentiating softmax(q kᵀ) v with autodiff (the "einsum" reference):
  1. Queries are split into C chunks. Under a causal mask chunk i only needs the keys up to its last
     query (and, with a sliding window W, from its first query - W + 1), so the masked upper triangle
     is never computed: with C = 4 and S = T, 62.5% of the T×S scores.
  2. The VJP is FlashAttention's (Dao et al. 2022, eq. for dS): it saves each chunk's probabilities P
     and uses rowsum(dO∘O) in place of rowsum(dP∘P), so the backward pass makes fewer passes over
     the (T, S) buffers than autodiff of masking and softmax does.
Scores and softmax are float32; P is cast to v's dtype for the PV products (as the reference does).
Measured on the 2-core CPU (BENCHMARKS.md): one GPT-2 attention layer fwd+bwd 59 → 39 ms.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

# Queries per chunk. One GPT-2 attention layer at T = 256 on the CPU (BENCHMARKS.md): chunks of 64
# 39.0 ms fwd+bwd, of 128 42.8, one chunk 47.8; in the whole step 32, 64 and 128 were within noise.
# At most _MAX_CHUNKS chunks keep the unrolled program small for long sequences.
CHUNK = 64
_MAX_CHUNKS = 16


def _spans(T: int, S: int, causal: bool, window: int) -> tuple[tuple[int, int, int, int], ...]:
    """(q0, q1, k0, k1) per chunk: the queries [q0, q1) attend (at most) to keys [k0, k1)."""
    if not causal:
        return ((0, T, 0, S),)
    n = max(1, min(_MAX_CHUNKS, -(-T // CHUNK)))
    bounds = np.linspace(0, T, n + 1).round().astype(int)
    return tuple((int(q0), int(q1), max(0, int(q0) - window + 1) if window else 0, int(q1))
                 for q0, q1 in zip(bounds[:-1], bounds[1:]))


def _chunk_forward(q_BKGCH, k_BKSH, v_BKSH, mask_B11CS, neg):
    logits = jnp.einsum("bkgch,bksh->bkgcs", q_BKGCH, k_BKSH, preferred_element_type=jnp.float32)
    logits = jnp.where(mask_B11CS, logits, neg)
    probs = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("bkgcs,bksh->bkgch", probs.astype(v_BKSH.dtype), v_BKSH)
    return out, probs


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention(q_BKGTH, k_BKSH, v_BKSH, mask_B11TS, spans):
    return _forward(q_BKGTH, k_BKSH, v_BKSH, mask_B11TS, spans)[0]


def _forward(q_BKGTH, k_BKSH, v_BKSH, mask_B11TS, spans):
    neg = jnp.asarray(-0.7 * jnp.finfo(jnp.float32).max, jnp.float32)  # as jax.nn.dot_product_attention
    outs, probs = [], []
    for q0, q1, k0, k1 in spans:
        out, p = _chunk_forward(q_BKGTH[:, :, :, q0:q1], k_BKSH[:, :, k0:k1], v_BKSH[:, :, k0:k1],
                                mask_B11TS[:, :, :, q0:q1, k0:k1], neg)
        outs.append(out)
        probs.append(p)
    out_BKGTH = jnp.concatenate(outs, axis=3) if len(outs) > 1 else outs[0]
    return out_BKGTH, (q_BKGTH, k_BKSH, v_BKSH, mask_B11TS, tuple(probs), out_BKGTH)


def _backward(spans, residuals, dout_BKGTH):
    q, k, v, mask, probs, out = residuals
    # rowsum(dO ∘ O) = rowsum(dP ∘ P): the softmax backward without another (T, S) reduction.
    delta_BKGT1 = jnp.sum(dout_BKGTH.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
    dq_chunks = []
    dk, dv = jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32)
    for (q0, q1, k0, k1), p in zip(spans, probs):
        do = dout_BKGTH[:, :, :, q0:q1]
        dv = dv.at[:, :, k0:k1].add(jnp.einsum("bkgcs,bkgch->bksh", p.astype(do.dtype), do,
                                               preferred_element_type=jnp.float32))
        dp = jnp.einsum("bkgch,bksh->bkgcs", do, v[:, :, k0:k1], preferred_element_type=jnp.float32)
        ds = (p * (dp - delta_BKGT1[:, :, :, q0:q1])).astype(q.dtype)
        dq_chunks.append(jnp.einsum("bkgcs,bksh->bkgch", ds, k[:, :, k0:k1]))
        dk = dk.at[:, :, k0:k1].add(jnp.einsum("bkgcs,bkgch->bksh", ds, q[:, :, :, q0:q1],
                                               preferred_element_type=jnp.float32))
    dq = jnp.concatenate(dq_chunks, axis=3) if len(dq_chunks) > 1 else dq_chunks[0]
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_attention.defvjp(_forward, _backward)


def chunked_attention(q_BTNH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array, mask_B1TS: jax.Array | None,
                      *, causal: bool, sliding_window: int = 0) -> jax.Array:
    """softmax(q kᵀ / sqrt(H), masked) v → out_BTNH; `mask_B1TS` must already contain the causal and
    window terms (the chunks only skip keys that the mask excludes anyway)."""
    B, T, N, H = q_BTNH.shape
    S, K = k_BSKH.shape[1], k_BSKH.shape[2]
    if N % K:
        raise ValueError(f"{K} key/value heads do not divide {N} query heads")
    if mask_B1TS is None:
        mask_B1TS = jnp.ones((1, 1, T, S), bool)
    scale = np.asarray(1.0 / np.sqrt(H), q_BTNH.dtype)
    q_BKGTH = (q_BTNH * scale).reshape(B, T, K, N // K, H).transpose(0, 2, 3, 1, 4)
    k_BKSH, v_BKSH = k_BSKH.transpose(0, 2, 1, 3), v_BSKH.transpose(0, 2, 1, 3)
    out_BKGTH = _attention(q_BKGTH, k_BKSH, v_BKSH, mask_B1TS[:, :, None],
                           _spans(T, S, causal, sliding_window))
    return out_BKGTH.transpose(0, 3, 1, 2, 4).reshape(B, T, N, H)
