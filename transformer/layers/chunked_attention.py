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
An additive bias (B' and N' in {1, B} and {1, N}: a position bias shared by the batch) joins each chunk's
scores; its gradient is the chunk's dS, summed over what the bias broadcasts (a learned bias table, T5's,
trains through it). Scores and softmax are float32; P is cast to v's dtype for the PV products (as the
reference does).
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


def _chunk_forward(q_BKGCH, k_BKSH, v_BKSH, mask_B11CS, bias_BKGCS, neg):
    logits = jnp.einsum("bkgch,bksh->bkgcs", q_BKGCH, k_BKSH, preferred_element_type=jnp.float32)
    if bias_BKGCS is not None:
        logits = logits + bias_BKGCS
    logits = jnp.where(mask_B11CS, logits, neg)
    probs = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("bkgcs,bksh->bkgch", probs.astype(v_BKSH.dtype), v_BKSH)
    return out, probs


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _attention(q_BKGTH, k_BKSH, v_BKSH, mask_B11TS, bias_BKGTS, spans):
    return _forward(q_BKGTH, k_BKSH, v_BKSH, mask_B11TS, bias_BKGTS, spans)[0]


def _forward(q_BKGTH, k_BKSH, v_BKSH, mask_B11TS, bias_BKGTS, spans):
    neg = jnp.asarray(-0.7 * jnp.finfo(jnp.float32).max, jnp.float32)  # as jax.nn.dot_product_attention
    outs, probs = [], []
    for q0, q1, k0, k1 in spans:
        bias = None if bias_BKGTS is None else bias_BKGTS[:, :, :, q0:q1, k0:k1]
        out, p = _chunk_forward(q_BKGTH[:, :, :, q0:q1], k_BKSH[:, :, k0:k1], v_BKSH[:, :, k0:k1],
                                mask_B11TS[:, :, :, q0:q1, k0:k1], bias, neg)
        outs.append(out)
        probs.append(p)
    out_BKGTH = jnp.concatenate(outs, axis=3) if len(outs) > 1 else outs[0]
    return out_BKGTH, (q_BKGTH, k_BKSH, v_BKSH, mask_B11TS, bias_BKGTS, tuple(probs), out_BKGTH)


def _sum_to(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """x summed over the axes where `shape` has 1 (what broadcasting it to x's shape expanded)."""
    axes = tuple(i for i, (n, m) in enumerate(zip(shape, x.shape)) if n == 1 and m != 1)
    return jnp.sum(x, axis=axes, keepdims=True) if axes else x


def _backward(spans, residuals, dout_BKGTH):
    q, k, v, mask, bias, probs, out = residuals
    # rowsum(dO ∘ O) = rowsum(dP ∘ P): the softmax backward without another (T, S) reduction.
    delta_BKGT1 = jnp.sum(dout_BKGTH.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
    dq_chunks = []
    dk, dv = jnp.zeros(k.shape, jnp.float32), jnp.zeros(v.shape, jnp.float32)
    dbias = None if bias is None else jnp.zeros(bias.shape, jnp.float32)
    for (q0, q1, k0, k1), p in zip(spans, probs):
        do = dout_BKGTH[:, :, :, q0:q1]
        dv = dv.at[:, :, k0:k1].add(jnp.einsum("bkgcs,bkgch->bksh", p.astype(do.dtype), do,
                                               preferred_element_type=jnp.float32))
        dp = jnp.einsum("bkgch,bksh->bkgcs", do, v[:, :, k0:k1], preferred_element_type=jnp.float32)
        ds_f32 = p * (dp - delta_BKGT1[:, :, :, q0:q1])       # d logits; the bias's gradient, chunk by chunk
        if dbias is not None:
            dbias = dbias.at[:, :, :, q0:q1, k0:k1].add(_sum_to(ds_f32, dbias.shape[:3] + (q1 - q0, k1 - k0)))
        ds = ds_f32.astype(q.dtype)
        dq_chunks.append(jnp.einsum("bkgcs,bksh->bkgch", ds, k[:, :, k0:k1]))
        dk = dk.at[:, :, k0:k1].add(jnp.einsum("bkgcs,bkgch->bksh", ds, q[:, :, :, q0:q1],
                                               preferred_element_type=jnp.float32))
    dq = jnp.concatenate(dq_chunks, axis=3) if len(dq_chunks) > 1 else dq_chunks[0]
    dbias = None if dbias is None else dbias.astype(bias.dtype)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, dbias


_attention.defvjp(_forward, _backward)


def chunked_attention(q_BTNH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array, mask_B1TS: jax.Array | None,
                      *, causal: bool, sliding_window: int = 0, bias_BNTS: jax.Array | None = None,
                      scale: float | None = None) -> jax.Array:
    """softmax(scale · q kᵀ + bias, masked) v → out_BTNH (scale None: 1/sqrt(H)); `mask_B1TS` must
    already contain the causal and window terms (the chunks only skip keys that the mask excludes anyway).
    bias_BNTS: float32, B and N may be 1."""
    B, T, N, H = q_BTNH.shape
    S, K = k_BSKH.shape[1], k_BSKH.shape[2]
    if N % K:
        raise ValueError(f"{K} key/value heads do not divide {N} query heads")
    if mask_B1TS is None:
        mask_B1TS = jnp.ones((1, 1, T, S), bool)
    scale = np.asarray(1.0 / np.sqrt(H) if scale is None else scale, q_BTNH.dtype)
    q_BKGTH = (q_BTNH * scale).reshape(B, T, K, N // K, H).transpose(0, 2, 3, 1, 4)
    k_BKSH, v_BKSH = k_BSKH.transpose(0, 2, 1, 3), v_BSKH.transpose(0, 2, 1, 3)
    bias_BKGTS = None
    if bias_BNTS is not None:  # heads grouped as the queries are: head n = k·G + g
        Bb = bias_BNTS.shape[0]
        bias_BKGTS = jnp.broadcast_to(bias_BNTS, (Bb, N, T, S)).reshape(Bb, K, N // K, T, S)
    out_BKGTH = _attention(q_BKGTH, k_BKSH, v_BKSH, mask_B1TS[:, :, None], bias_BKGTS,
                           _spans(T, S, causal, sliding_window))
    return out_BKGTH.transpose(0, 3, 1, 2, 4).reshape(B, T, N, H)
