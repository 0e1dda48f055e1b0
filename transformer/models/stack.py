"""Embeddings → N blocks → final norm: the body every family shares (decoder, encoder, encoder–decoder).

Legend: B batch, T sequence, S context (source) length, D model width.

`embed_and_stack` runs inside a compact module's method and creates its submodules in that module's
scope (position_embedding, relative_position_bias, embedding_norm, blocks, final_norm, and the
"next_position" / "key_slots" decoding state), so a DecoderLM keeps them at the top of its parameter
tree while each stack of an encoder–decoder keeps them under its own name (`EmbeddedStack`).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.layers import positional
from transformer.layers.dtypes import compute_dtypes
from transformer.layers.embeddings import TokenEmbedding
from transformer.layers.norms import make_norm
from transformer.models.blocks import BlockStack
from transformer.spec import ModelConfig


def embed_inputs(cfg: ModelConfig, embedding: TokenEmbedding, tokens_BT: jax.Array,
                 positions_BT: jax.Array) -> jax.Array:
    """Token embedding (× sqrt(D) if scale_embeddings) plus an absolute position encoding (a learned
    table becomes the calling module's "position_embedding" submodule), in the compute dtype."""
    dtype, _ = compute_dtypes(cfg)
    x_BTD = embedding(tokens_BT)
    if cfg.scale_embeddings:
        x_BTD = x_BTD * jnp.sqrt(jnp.asarray(cfg.d_model, dtype))
    if cfg.positional in positional.ABSOLUTE:
        x_BTD = x_BTD + positional.ABSOLUTE[cfg.positional](cfg, positions_BT).astype(dtype)
    return x_BTD.astype(dtype)


def position_bias(module: nn.Module, cfg: ModelConfig, T: int, start: jax.Array | int, *, causal: bool,
                  decode: bool) -> jax.Array | None:
    """The stack's bias_1NTS for cfg.positional in positional.BIAS (None for other encodings), from slots:
    queries 0..T-1 against keys 0..T-1, or when decoding the T new tokens at cache slots start.. against
    every slot of the cache. The stack's "key_slots" cache variable (S,) holds the slot of each cached key,
    written as tokens arrive; it is how the stack knows the cache's length S."""
    if cfg.positional not in positional.BIAS:
        return None
    q_slots_T = start + jnp.arange(T, dtype=jnp.int32)
    k_slots_S = q_slots_T
    if decode:
        initialized = module.has_variable("cache", "key_slots")
        key_slots = module.variable("cache", "key_slots", lambda: jnp.arange(T, dtype=jnp.int32))
        if initialized:  # a decoding step: T new keys at `start`, attending to all S slots
            key_slots.value = jax.lax.dynamic_update_slice(key_slots.value, q_slots_T, (start,))
            k_slots_S = key_slots.value
    return positional.BIAS[cfg.positional](cfg, q_slots_T, k_slots_S, causal)


def embed_and_stack(module: nn.Module, cfg: ModelConfig, embedding: TokenEmbedding, tokens_BT: jax.Array,
                    positions_BT: jax.Array | None, segment_ids_BT: jax.Array | None,
                    context_BSD: jax.Array | None = None, context_segment_ids_BS: jax.Array | None = None, *,
                    causal: bool, cross_attention: bool = False, num_layers: int = 0, sow_weights: bool = False,
                    deterministic: bool = True, decode: bool = False) -> jax.Array:
    """tokens_BT -> hidden x_BTD. Called from `module`'s compact method.

    1. positions default to 0..T-1; when decoding they count on from the cached ones
    2. token embedding + absolute positions (RoPE rotates q and k inside attention instead; a position
       bias, ALiBi or T5's, is computed here once, bias_1NTS, and added in every self-attention layer)
    3. optional embedding norm, dropout
    4. `num_layers` (0: cfg.num_layers) TransformerBlocks: self-attention (causal or not; packed
       documents kept apart by segment ids, 0 = padding), optional cross-attention to context_BSD,
       feed-forward; each sub-layer in a residual branch, pre-LN or post-LN
    5. final norm (pre-LN only: post-LN blocks already end with a norm)
    """
    B, T = tokens_BT.shape
    start = 0
    if decode:  # tokens continue the cached ones: default positions count on from there
        initialized = module.has_variable("cache", "next_position")
        next_position = module.variable("cache", "next_position", lambda: jnp.zeros((), jnp.int32))
        if initialized:
            start = next_position.value
            next_position.value = start + T
    if positions_BT is None:
        positions_BT = jnp.broadcast_to(start + jnp.arange(T, dtype=jnp.int32), (B, T))
    x_BTD = embed_inputs(cfg, embedding, tokens_BT, positions_BT)
    bias_1NTS = position_bias(module, cfg, T, start, causal=causal, decode=decode)
    if cfg.embedding_norm:
        x_BTD = make_norm(cfg, "embedding_norm")(x_BTD)
    x_BTD = nn.Dropout(cfg.dropout_rate)(x_BTD, deterministic=deterministic)
    x_BTD = nn.with_logical_constraint(x_BTD, ("batch", "seq", "act_embed"))
    x_BTD = BlockStack(cfg, causal=causal, cross_attention=cross_attention, num_layers=num_layers,
                       sow_weights=sow_weights, name="blocks")(
        x_BTD, positions_BT, segment_ids_BT, context_BSD, context_segment_ids_BS, bias_1NTS, deterministic, decode)
    if cfg.norm_position == "pre":
        x_BTD = make_norm(cfg, "final_norm")(x_BTD)
    return x_BTD
