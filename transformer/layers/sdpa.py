"""Scaled dot-product attention, the function: one registry of implementations, the einsum reference, the masks.

Legend: B batch, T query length, S key/value length, D model width, N query heads,
K key/value heads (K divides N; K == N is multi-head, K == 1 multi-query), G = N // K query heads
per key/value head, H head dimension.

Masks are boolean, True = may attend, shaped (B, 1, T, S) and broadcast over heads. They combine
  causal      key index s <= query index t (+ offset of the first query when decoding from a cache);
  segments    packed documents: query and key must carry the same segment id (0 = padding, so
              padding only ever sees padding and never leaks into a document);
  window      sliding_window W > 0: t - s < W (causal) or |t - s| < W (bidirectional).

An additive bias_BNTS (float32; B and N may be 1) joins the logits before masking: the position biases of
positional.BIAS (ALiBi, T5's relative buckets), computed once per stack and handed to every self-attention
layer. The logits are scaled by `scale` (model.attention_scale; None/0 means 1/sqrt(H); T5 uses 1).

`model.attention_impl` picks one entry of ATTENTION_IMPLEMENTATIONS, for training, evaluation and
decoding alike (the decode step calls the same entry with its cache offset):
  "einsum"   the reference: softmax(q kᵀ/sqrt(H)) v written as two einsums, unfused, differentiated by
             autodiff. The only one that can return the weights (attention maps force it).
  "chunked"  chunked_attention.py: the same math in query chunks that skip the masked causal blocks,
             with a written-out backward pass (including the bias's gradient); the fastest on CPU.
  "cudnn"    jax.nn.dot_product_attention(implementation="cudnn"): cuDNN's fused flash-attention
             kernel on NVIDIA GPUs; needs bfloat16 compute (checked in ModelConfig). Causal masking
             and the sliding window go to the kernel as flags (is_causal, local_window_size), so no
             (T, S) mask exists. Packed sequences (segment ids) have no public jax argument (only
             per-row lengths, which cannot express several documents in a row): their mask goes in
             as a boolean (B, 1, T, S) array that jax turns into an additive bias for the same fused
             kernel — still flash attention, plus one O(B·T·S) bias read. Without segment ids there
             is no mask array at all.
             A position bias is not taken: choosing "cudnn" with positional=alibi or t5_relative is
             a ConfigError (resolve_attention_impl), and "auto" picks "chunked" for them.
  "auto"     (the default) resolved when the model is built, from jax.default_backend():
             "cudnn" on GPU with bfloat16 compute (and a head dim cuDNN takes, and no position
             bias), else "chunked".
The former "xla" choice (jax.nn.dot_product_attention with no implementation) ran the same unfused
XLA computation as "einsum" on this jax and was removed; naming it is a ConfigError.
Softmax is always float32.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from transformer.layers import positional
from transformer.layers.chunked_attention import chunked_attention
from transformer.spec import AUTO, ConfigError, ModelConfig

# The name, for remat policies (jax.ad_checkpoint.checkpoint_name), of each attention layer's output (out_BTNH,
# the out projection's input) and, with remat "dots_no_batch_attention", of what the attention's backward reads:
# models/blocks.py's policy of that name saves them, so the backward pass never reruns the attention.
ATTENTION_OUT = "attention_out"


def make_attention_mask(q_len: int, kv_len: int, *, causal: bool,
                        q_segment_ids_BT: jax.Array | None = None,
                        kv_segment_ids_BS: jax.Array | None = None,
                        sliding_window: int = 0,
                        q_offset: jax.Array | int = 0) -> jax.Array | None:
    """Boolean mask_B1TS (B is 1 without segment ids); None when nothing is masked."""
    mask = None
    t_T1 = jnp.arange(q_len)[:, None] + q_offset
    s_1S = jnp.arange(kv_len)[None, :]
    if causal:
        mask = (s_1S <= t_T1)[None, None]
    if sliding_window:
        near = (t_T1 - s_1S < sliding_window) if causal else (jnp.abs(t_T1 - s_1S) < sliding_window)
        mask = near[None, None] if mask is None else mask & near[None, None]
    if q_segment_ids_BT is not None or kv_segment_ids_BS is not None:
        if q_segment_ids_BT is None or kv_segment_ids_BS is None:
            raise ValueError("segment ids must be given for both queries and keys, or for neither")
        same = (q_segment_ids_BT[:, :, None] == kv_segment_ids_BS[:, None, :])[:, None]
        mask = same if mask is None else mask & same
    return mask


def _large_negative(dtype: Any) -> jax.Array:
    # The value jax.nn.dot_product_attention uses, so that fully masked rows agree (uniform weights).
    return jnp.asarray(-0.7 * jnp.finfo(dtype).max, dtype)


def dot_product_attention_einsum(q_BTNH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array,
                                 mask_B1TS: jax.Array | None = None, bias_BNTS: jax.Array | None = None,
                                 *, scale: float | None = None,
                                 return_weights: bool = False) -> jax.Array | tuple[jax.Array, jax.Array]:
    """softmax(scale · q kᵀ + bias, masked) v with grouped-query heads; scale None: 1/sqrt(H).

    Returns out_BTNH, or (out_BTNH, weights_BNTS float32) with return_weights.
    """
    B, T, N, H = q_BTNH.shape
    K = k_BSKH.shape[2]
    if N % K:
        raise ValueError(f"{K} key/value heads do not divide {N} query heads")
    q_BTKGH = q_BTNH.reshape(B, T, K, N // K, H)
    logits_BKGTS = jnp.einsum("btkgh,bskh->bkgts", q_BTKGH, k_BSKH, preferred_element_type=jnp.float32)
    logits_BKGTS = logits_BKGTS * np.float32(1.0 / np.sqrt(H) if scale is None else scale)
    S = logits_BKGTS.shape[-1]
    if bias_BNTS is not None:
        logits_BKGTS = logits_BKGTS + jnp.broadcast_to(bias_BNTS, (B, N, T, S)).reshape(
            B, K, N // K, T, S).astype(jnp.float32)
    if mask_B1TS is not None:
        logits_BKGTS = jnp.where(mask_B1TS[:, :, None], logits_BKGTS, _large_negative(jnp.float32))
    probs_BKGTS = jax.nn.softmax(logits_BKGTS, axis=-1)
    out_BTKGH = jnp.einsum("bkgts,bskh->btkgh", probs_BKGTS.astype(v_BSKH.dtype), v_BSKH)
    out_BTNH = out_BTKGH.reshape(B, T, N, H)
    if return_weights:
        return out_BTNH, probs_BKGTS.reshape(B, N, T, S)
    return out_BTNH


# Every implementation: (q_BTNH, k_BSKH, v_BSKH, *, causal, q_segment_ids_BT, kv_segment_ids_BS,
# sliding_window, q_offset, bias_BNTS, scale) -> out_BTNH, the arguments as in dot_product_attention.
_MASK_FLAGS = ("causal", "q_segment_ids_BT", "kv_segment_ids_BS", "sliding_window", "q_offset")


def _full_mask(q_BTNH, k_BSKH, **flags) -> jax.Array | None:
    """make_attention_mask for these queries and keys: every term in one boolean mask_B1TS (or None)."""
    return make_attention_mask(q_BTNH.shape[1], k_BSKH.shape[1], **{f: flags[f] for f in _MASK_FLAGS if f in flags})


def _einsum_impl(q_BTNH, k_BSKH, v_BSKH, **flags):
    return dot_product_attention_einsum(q_BTNH, k_BSKH, v_BSKH, _full_mask(q_BTNH, k_BSKH, **flags),
                                        flags["bias_BNTS"], scale=flags["scale"])


def _chunked_impl(q_BTNH, k_BSKH, v_BSKH, **flags):
    # Causal block skipping needs query t to be key t; a decode step (cache offset) uses one chunk.
    aligned = _is_static_zero(flags["q_offset"])
    return chunked_attention(q_BTNH, k_BSKH, v_BSKH, _full_mask(q_BTNH, k_BSKH, **flags),
                             causal=flags["causal"] and aligned, sliding_window=flags["sliding_window"] if aligned else 0,
                             bias_BNTS=flags["bias_BNTS"], scale=flags["scale"])


def _cudnn_impl(q_BTNH, k_BSKH, v_BSKH, **flags):
    if flags["bias_BNTS"] is not None:  # resolve_attention_impl refuses cudnn with a position bias
        raise ValueError("attention_impl='cudnn' takes no bias_BNTS here; use 'chunked' or 'einsum'")
    scale = {} if flags["scale"] is None else {"scale": flags["scale"]}
    if not _is_static_zero(flags["q_offset"]):
        # Decoding: T new queries at a cache offset, which the kernel's causal flag cannot express.
        return jax.nn.dot_product_attention(q_BTNH, k_BSKH, v_BSKH, mask=_full_mask(q_BTNH, k_BSKH, **flags),
                                            implementation="cudnn", **scale)
    # Causal and window as kernel flags; only segments (packed documents) need a mask array.
    causal, W = flags["causal"], flags["sliding_window"]
    segment_mask_B1TS = _full_mask(q_BTNH, k_BSKH, causal=False, q_segment_ids_BT=flags["q_segment_ids_BT"],
                                   kv_segment_ids_BS=flags["kv_segment_ids_BS"])
    window = ((W - 1, 0) if causal else (W - 1, W - 1)) if W else None
    return jax.nn.dot_product_attention(q_BTNH, k_BSKH, v_BSKH, mask=segment_mask_B1TS, is_causal=causal,
                                        local_window_size=window, implementation="cudnn", **scale)


def _is_static_zero(q_offset: jax.Array | int) -> bool:
    return isinstance(q_offset, int) and q_offset == 0


# `model.attention_impl` selects one by name (checked where models are built, transformer.models.resolve).
# A new variant is a function with this signature and one line here; "einsum" stays the reference
# that tests compare against.
ATTENTION_IMPLEMENTATIONS = {
    "einsum": _einsum_impl,
    "chunked": _chunked_impl,
    "cudnn": _cudnn_impl,
}
REMOVED_IMPLEMENTATIONS = {
    "xla": "it ran jax.nn.dot_product_attention with no implementation, the same unfused XLA computation "
           "as 'einsum' on this jax",
}
ATTENTION_CHOICES = (AUTO, *ATTENTION_IMPLEMENTATIONS)


def check_attention_impl(name: str) -> None:
    """ConfigError unless `name` is a valid model.attention_impl."""
    if name in ATTENTION_CHOICES:
        return
    why = f" ({REMOVED_IMPLEMENTATIONS[name]})" if name in REMOVED_IMPLEMENTATIONS else ""
    raise ConfigError(f"model.attention_impl={name!r} is not valid{why}; choose one of {', '.join(ATTENTION_CHOICES)}")


def resolve_attention_impl(cfg: ModelConfig, backend: str | None = None) -> str:
    """The implementation cfg.attention_impl names; "auto" becomes "cudnn" on GPU with bfloat16 compute and a
    head dimension cuDNN's flash kernel takes (a multiple of 8, at most 128), no bidirectional window and no
    position bias, else "chunked". backend: jax.default_backend() unless given. "cudnn" with a position bias
    (positional.BIAS) is a ConfigError."""
    check_attention_impl(cfg.attention_impl)
    biased = cfg.positional in positional.BIAS
    if cfg.attention_impl == "cudnn" and biased:
        raise ConfigError(f"model.attention_impl='cudnn' takes no position bias here (model.positional="
                          f"{cfg.positional!r} adds one to the logits); use attention_impl='auto', 'chunked' or "
                          "'einsum'")
    if cfg.attention_impl != AUTO:
        return cfg.attention_impl
    backend = jax.default_backend() if backend is None else backend
    H = cfg.dim_per_head
    cudnn_ok = (backend == "gpu" and cfg.dtype != "float32" and H % 8 == 0 and H <= 128 and not biased
                and not (cfg.sliding_window and cfg.family != "decoder"))
    return "cudnn" if cudnn_ok else "chunked"


def _named_residuals(fn: Any, name: str) -> Any:
    """fn with the same values and gradients, whose backward pass reads only residuals named `name`
    (jax.ad_checkpoint.checkpoint_name): a remat policy that saves that name keeps everything fn's backward
    needs (for a flash kernel: q, k, v, its output and softmax statistics), so fn is not run again."""

    @jax.custom_vjp
    def call(*args):
        return fn(*args)

    def forward(*args):
        out, pullback = jax.vjp(fn, *args)
        return out, jax.tree.map(lambda r: checkpoint_name(r, name), pullback)

    def backward(pullback, dout):
        return pullback(dout)

    call.defvjp(forward, backward)
    return call


def dot_product_attention(q_BTNH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array, *, causal: bool,
                          q_segment_ids_BT: jax.Array | None = None,
                          kv_segment_ids_BS: jax.Array | None = None,
                          sliding_window: int = 0, implementation: str = "einsum",
                          q_offset: jax.Array | int = 0, bias_BNTS: jax.Array | None = None,
                          scale: float | None = None, return_weights: bool = False,
                          save_for_backward: bool = False) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Attention with the masks built from flags. q_offset 0: query t and key t are the same position
    (T == S when causal); a decode step passes its cache index, query t being key q_offset + t.
    bias_BNTS (B and N may be 1) is added to the logits; scale multiplies q·k (None: 1/sqrt(H)).

    return_weights uses the einsum reference and returns (out_BTNH, weights_BNTS).
    save_for_backward: name what the backward pass reads ATTENTION_OUT (_named_residuals), for the remat
    policy "dots_no_batch_attention"; values and gradients are unchanged.
    """
    if implementation == AUTO or implementation not in ATTENTION_IMPLEMENTATIONS:
        check_attention_impl(implementation)
        raise ValueError(f"attention_impl={implementation!r} must be resolved first (resolve_attention_impl)")
    T, S = q_BTNH.shape[1], k_BSKH.shape[1]
    if causal and T != S and _is_static_zero(q_offset):
        raise ValueError(f"causal attention needs as many queries as keys, got T={T}, S={S}")
    flags = dict(causal=causal, q_segment_ids_BT=q_segment_ids_BT, kv_segment_ids_BS=kv_segment_ids_BS,
                 sliding_window=sliding_window, q_offset=q_offset)
    if return_weights:
        mask_B1TS = make_attention_mask(T, S, **flags)
        return dot_product_attention_einsum(q_BTNH, k_BSKH, v_BSKH, mask_B1TS, bias_BNTS, scale=scale,
                                            return_weights=True)
    impl = ATTENTION_IMPLEMENTATIONS[implementation]
    if not save_for_backward:
        return impl(q_BTNH, k_BSKH, v_BSKH, bias_BNTS=bias_BNTS, scale=scale, **flags)

    def run(q, k, v, q_seg, kv_seg, bias):
        return impl(q, k, v, bias_BNTS=bias, scale=scale, **{**flags, "q_segment_ids_BT": q_seg,
                                                              "kv_segment_ids_BS": kv_seg})
    return _named_residuals(run, ATTENTION_OUT)(q_BTNH, k_BSKH, v_BSKH, q_segment_ids_BT, kv_segment_ids_BS,
                                                bias_BNTS)
