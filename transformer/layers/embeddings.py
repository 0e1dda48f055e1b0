"""Token embedding ("vocab", "embed") and the output head (tied: `attend`; untied: ("embed", "vocab")).

The head multiplies compute-dtype operands but accumulates and returns the logits in float32
(preferred_element_type), so bf16 compute does not round the logits before the float32 loss. Under μP
(model.parametrization="mup") both heads multiply the float32 logits by base_width / d_model
(transformer/layers/mup.py); under SP they are left as they are.

Legend: B batch, T sequence, D model width, V vocabulary.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.layers import mup
from transformer.layers.dtypes import compute_dtypes
from transformer.spec import ModelConfig


class TokenEmbedding(nn.Module):
    """tokens_BT -> x_BTD; `attend(x_BTD) -> logits_BTV` (float32) reuses the table as a tied head."""

    cfg: ModelConfig

    def setup(self) -> None:
        _, param_dtype = compute_dtypes(self.cfg)
        self.embedding = self.param(
            "embedding", nn.with_logical_partitioning(nn.initializers.normal(0.02), ("vocab", "embed")),
            (self.cfg.vocab_size, self.cfg.d_model), param_dtype)

    def __call__(self, tokens_BT: jax.Array) -> jax.Array:
        dtype, _ = compute_dtypes(self.cfg)
        return jnp.take(self.embedding, tokens_BT, axis=0).astype(dtype)

    def attend(self, x_BTD: jax.Array) -> jax.Array:
        dtype, _ = compute_dtypes(self.cfg)
        # Products of compute-dtype operands, accumulated and returned in float32 (not rounded to bf16).
        logits_BTV = jnp.einsum("btd,vd->btv", x_BTD.astype(dtype), self.embedding.astype(dtype),
                                preferred_element_type=jnp.float32)
        return mup.scale_logits(self.cfg, logits_BTV)


class OutputHead(nn.Module):
    """An untied output projection x_BTD -> logits_BTV (float32), no bias."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BTD: jax.Array) -> jax.Array:
        dtype, param_dtype = compute_dtypes(self.cfg)
        kernel_DV = self.param(
            "kernel", nn.with_logical_partitioning(nn.initializers.normal(0.02), ("embed", "vocab")),
            (self.cfg.d_model, self.cfg.vocab_size), param_dtype)
        logits_BTV = jnp.einsum("btd,dv->btv", x_BTD.astype(dtype), kernel_DV.astype(dtype),
                                preferred_element_type=jnp.float32)
        return mup.scale_logits(self.cfg, logits_BTV)
