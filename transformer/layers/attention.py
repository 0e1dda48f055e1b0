"""The multi-head attention layer (Linen): projections, RoPE, the key/value cache for decoding, LoRA and
per-head masks; the attention itself is sdpa.dot_product_attention (the registry of implementations and the masks).

Legend: B batch, T query length, S key/value length, D model width, N query heads,
K key/value heads (K divides N; K == N is multi-head, K == 1 multi-query), H head dimension.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from transformer.layers.dtypes import compute_dtypes
from transformer.layers import mup, positional
from transformer.layers.norms import make_head_norm
from transformer.layers.projection import Projection, lora_of
from transformer.layers.sdpa import ATTENTION_OUT, dot_product_attention, resolve_attention_impl
from transformer.spec import ModelConfig, pruning

# The collection of the per-head masks (one "mask" of shape (N,) per attention layer) that head importance
# differentiates the loss by (training/heads.py); models apply without it unless a caller passes one.
HEAD_MASK = "head_mask"


class CacheOverflowError(ValueError):
    """Decoding wrote past the end of the key/value cache (a bug in the caller, not bad config)."""


def _raise_overflow(index: Any, T: int, S: int) -> None:
    raise CacheOverflowError(f"key/value cache overflow: {T} new token(s) at cache slot {int(index)} need "
                             f"{int(index) + T} slots but the cache holds {S}; create the cache with "
                             f"model.init(..., decode=True) on inputs as long as the whole decode")


def check_cache_room(index: jax.Array | int, T: int, S: int) -> None:
    """Writing T tokens at `index` of a cache of S slots must fit: dynamic_update_slice would clamp the
    start and silently overwrite the last slots. A Python error when the index is known (eager apply,
    or T > S); under jit a host callback that runs only on overflow and fails the computation."""
    if T > S:
        _raise_overflow(0, T, S)
    if not isinstance(index, jax.core.Tracer):
        if int(index) + T > S:
            _raise_overflow(index, T, S)
        return
    jax.lax.cond(index + T > S, lambda: jax.debug.callback(_raise_overflow, index, T, S), lambda: None)


class MultiHeadAttention(nn.Module):
    """Self-attention (context_BSD None) or cross-attention (keys/values from context_BSD).

    q/k/v/out projections: ("embed","heads","head_dim"), ("embed","kv_heads","head_dim") ×2,
    ("heads","head_dim","embed"); biases when cfg.use_bias. cfg.qk_norm: RMSNorm of each head's q and k
    over H (query_norm, key_norm: scale ("head_dim",)), after the projection and before RoPE.
    RoPE (cfg.positional == "rope") rotates q and k of self-attention by their positions; a position bias (ALiBi, T5's buckets) comes in as
    bias_BNTS, made once per stack (transformer/models/stack.py), and joins self-attention's logits
    only. q·k is scaled by cfg.attention_scale (0: 1/sqrt(H)). `out_std` is the init std of the out projection.

    decode=True: autoregressive decoding with a key/value cache in the "cache" collection
    (cached_key, cached_value, cached_segment_ids, cache_index). `model.init(..., decode=True)` with
    inputs of the full decoding length creates an empty cache of that length; each later call
    appends its T new tokens (positions must be given) and attends causally to everything cached.
    Writing past the cache's length is an error (check_cache_room), never a silent clamp; check_cache=False
    leaves the check of the index (not of T > S) to the caller: a scanned BlockStack checks once, outside
    nn.scan, because a host callback inside the scanned body fails under jax 0.11 ("broadcasted variable has
    a data dependency on the scan body", seen on the GPU machine). Cross-attention projects the context once, when
    the cache is created (cached_cross_key, cached_cross_value), and later calls reuse that projection,
    so the cache must be made with the real context (an apply with mutable=["cache"], not zeros).
    sow_weights=True stores the attention weights_BNTS in the "intermediates" collection. A "head_mask" collection
    (HEAD_MASK: "mask" (N,)) multiplies each head's output before the out projection (head importance, pruning).
    cfg.pruned_heads: this layer (by its module path) has only the heads it keeps (N and K smaller).
    """

    cfg: ModelConfig
    causal: bool = False
    out_std: float = 0.02
    sow_weights: bool = False
    check_cache: bool = True

    @nn.compact
    def __call__(self, x_BTD: jax.Array, positions_BT: jax.Array | None = None,
                 segment_ids_BT: jax.Array | None = None, context_BSD: jax.Array | None = None,
                 context_segment_ids_BS: jax.Array | None = None, *, bias_BNTS: jax.Array | None = None,
                 decode: bool = False, return_weights: bool = False,
                 deterministic: bool = True) -> jax.Array | tuple[jax.Array, jax.Array]:
        cfg = self.cfg
        dtype, param_dtype = compute_dtypes(cfg)
        N, K, H = cfg.num_heads, cfg.kv_heads, cfg.dim_per_head
        if cfg.pruned_heads:  # this layer's heads (spec/pruning.py): its kernels hold only the kept heads' rows
            removed = pruning.parse(cfg.pruned_heads).get("/".join(self.path), ())
            kept_q, _ = pruning.kept_heads(N, K, removed)
            N, K = pruning.layer_heads(cfg, "/".join(self.path))
            if bias_BNTS is not None and removed:  # a stack's position bias covers every head: the kept ones'
                bias_BNTS = jnp.take(bias_BNTS, jnp.asarray(kept_q), axis=1)
        cross = context_BSD is not None
        if cross and bias_BNTS is not None:
            raise ValueError("a position bias belongs to self-attention; cross-attention takes none")
        kv_BSD = context_BSD if cross else x_BTD
        scale = mup.attention_scale(cfg)  # None: 1/sqrt(H); SP: cfg.attention_scale or None

        def proj(heads: int, axis_name: str, name: str) -> "Projection":
            return Projection("btd,dnh->btnh", (cfg.d_model, heads, H), ("embed", axis_name, "head_dim"),
                              bias_names=(axis_name, "head_dim") if cfg.use_bias else None, init_std=0.02,
                              dtype=dtype, param_dtype=param_dtype, lora=lora_of(cfg, name), name=name)

        q_BTNH = proj(N, "heads", "query")(x_BTD, deterministic)
        if cfg.qk_norm:  # each head's query normalised over H (before RoPE), one scale shared by the heads
            q_BTNH = make_head_norm(cfg, "query_norm")(q_BTNH)
        if cross and decode and self.has_variable("cache", "cached_cross_key"):
            # Decoding: the context is fixed, so its keys/values were projected once, when the cache was made.
            k_BSKH = self.get_variable("cache", "cached_cross_key")
            v_BSKH = self.get_variable("cache", "cached_cross_value")
        else:
            k_BSKH = proj(K, "kv_heads", "key")(kv_BSD, deterministic)
            if cfg.qk_norm:
                k_BSKH = make_head_norm(cfg, "key_norm")(k_BSKH)
            v_BSKH = proj(K, "kv_heads", "value")(kv_BSD, deterministic)
            if cross and decode:
                self.put_variable("cache", "cached_cross_key", k_BSKH)
                self.put_variable("cache", "cached_cross_value", v_BSKH)
        if cfg.positional in positional.ROTARY and not cross:
            if positions_BT is None:
                raise ValueError(f"{cfg.positional} attention needs positions_BT")
            q_BTNH = positional.ROTARY[cfg.positional](cfg, q_BTNH, positions_BT)
            k_BSKH = positional.ROTARY[cfg.positional](cfg, k_BSKH, positions_BT)
        q_BTNH = nn.with_logical_constraint(q_BTNH, ("batch", "seq", "act_heads", "act_head_dim"))
        k_BSKH = nn.with_logical_constraint(k_BSKH, ("batch", "seq", "act_kv_heads", "act_head_dim"))
        v_BSKH = nn.with_logical_constraint(v_BSKH, ("batch", "seq", "act_kv_heads", "act_head_dim"))

        want_weights = return_weights or self.sow_weights
        impl = resolve_attention_impl(cfg)
        q_seg, kv_seg = segment_ids_BT, (context_segment_ids_BS if cross else segment_ids_BT)
        if cross and (q_seg is None) != (kv_seg is None):
            q_seg = jnp.ones(x_BTD.shape[:2], jnp.int32) if q_seg is None else q_seg
            kv_seg = jnp.ones(kv_BSD.shape[:2], jnp.int32) if kv_seg is None else kv_seg

        if decode and not cross and self.has_variable("cache", "cached_key"):
            out = self._decode_step(q_BTNH, k_BSKH, v_BSKH, segment_ids_BT, impl, want_weights, bias_BNTS, scale)
        else:
            if decode and not cross:  # initialisation: an empty cache as long as these inputs
                self.variable("cache", "cached_key", jnp.zeros, k_BSKH.shape, k_BSKH.dtype)
                self.variable("cache", "cached_value", jnp.zeros, v_BSKH.shape, v_BSKH.dtype)
                self.variable("cache", "cached_segment_ids", jnp.zeros, k_BSKH.shape[:2], jnp.int32)
                self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
            out = dot_product_attention(
                q_BTNH, k_BSKH, v_BSKH, causal=self.causal and not cross, q_segment_ids_BT=q_seg,
                kv_segment_ids_BS=kv_seg, sliding_window=cfg.sliding_window, implementation=impl,
                bias_BNTS=bias_BNTS, scale=scale, return_weights=want_weights,
                save_for_backward=cfg.remat == "dots_no_batch_attention" and not decode)
        out_BTNH, weights_BNTS = out if want_weights else (out, None)
        if self.has_variable(HEAD_MASK, "mask") or (self.is_mutable_collection(HEAD_MASK) and not self.is_initializing()):
            # Michel et al. 2019's head mask ξ (training/heads.py): each head's output × ξ_n, a variable of its own
            # collection so that the loss can be differentiated with respect to it; created as ones by an apply with
            # the collection mutable (heads.mask_ones), read when given, absent otherwise (no multiplication at all).
            mask_N = self.variable(HEAD_MASK, "mask", jnp.ones, (N,), jnp.float32).value
            out_BTNH = out_BTNH * mask_N[:, None].astype(out_BTNH.dtype)
        out_BTNH = checkpoint_name(out_BTNH, ATTENTION_OUT)  # the out projection's backward reads it
        if self.sow_weights:
            self.sow("intermediates", "attention_weights", weights_BNTS)

        out_BTD = Projection("btnh,nhd->btd", (N, H, cfg.d_model), ("heads", "head_dim", "embed"),
                             bias_names=("embed",) if cfg.use_bias else None, init_std=self.out_std,
                             dtype=dtype, param_dtype=param_dtype, lora=lora_of(cfg, "out"), name="out")(
            out_BTNH, deterministic)
        return (out_BTD, weights_BNTS) if return_weights else out_BTD

    def _decode_step(self, q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array,
                     segment_ids_BT: jax.Array | None, impl: str, want_weights: bool,
                     bias_BNTS: jax.Array | None, scale: float | None):
        """Append T new keys/values at cache_index and attend to the whole cache (through the registry);
        bias_BNTS, when given, covers these T queries against all S cache slots."""
        cached_k = self.variable("cache", "cached_key", jnp.zeros, k_BTKH.shape, k_BTKH.dtype)
        cached_v = self.variable("cache", "cached_value", jnp.zeros, v_BTKH.shape, v_BTKH.dtype)
        cached_seg = self.variable("cache", "cached_segment_ids", jnp.zeros, k_BTKH.shape[:2], jnp.int32)
        cache_index = self.variable("cache", "cache_index", lambda: jnp.zeros((), jnp.int32))
        B, T = q_BTNH.shape[:2]
        i = cache_index.value
        check_cache_room(i if self.check_cache else 0, T, cached_k.value.shape[1])
        seg_BT = jnp.ones((B, T), jnp.int32) if segment_ids_BT is None else segment_ids_BT.astype(jnp.int32)
        cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k_BTKH.astype(cached_k.value.dtype), (0, i, 0, 0))
        cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v_BTKH.astype(cached_v.value.dtype), (0, i, 0, 0))
        cached_seg.value = jax.lax.dynamic_update_slice(cached_seg.value, seg_BT, (0, i))
        cache_index.value = i + T
        return dot_product_attention(q_BTNH, cached_k.value, cached_v.value, causal=True, q_segment_ids_BT=seg_BT,
                                     kv_segment_ids_BS=cached_seg.value, sliding_window=self.cfg.sliding_window,
                                     implementation=impl, q_offset=i, bias_BNTS=bias_BNTS, scale=scale,
                                     return_weights=want_weights)
