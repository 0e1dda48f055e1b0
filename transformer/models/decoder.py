"""A decoder-only Transformer language model (GPT-2 and LLaMA shapes are configs, not code).

Legend: B batch, T sequence, D model width (d_model), V vocabulary, L layers.

Reading top to bottom, as in nanoGPT:
Steps 1–5 are `embed_and_stack` (transformer/models/stack.py), shared with the other families:
  1. tokens_BT -> token embedding x_BTD (table ("vocab", "embed"); × sqrt(D) if scale_embeddings)
  2. + positions: learned table ("positions", "embed") | sinusoidal | nothing (RoPE rotates q and k
     inside attention instead; ALiBi and T5's relative buckets are one bias, made here once and added to
     every layer's attention logits; "none" adds nothing)
  3. optional embedding norm, dropout
  4. L × TransformerBlock(causal=True) from transformer/models/blocks.py: causal self-attention and
     a feed-forward layer, each in a residual branch, pre-LN or post-LN; packed documents are kept
     apart by segment ids (0 = padding)
  5. final norm (pre-LN only: post-LN blocks already end with a norm)
  6. output head: the embedding table transposed (tied) or its own ("embed", "vocab") kernel
     -> logits_BTV in float32.
GPT-2 = learned positions, pre-LN LayerNorm, GELU, biases, tied head; LLaMA = RoPE, RMSNorm, SwiGLU,
grouped-query attention, no biases, untied head (configs/lm.py). Parameter counts and FLOPs per token
come from the config alone in transformer/spec/accounting.py (`param_counts`, `flops_per_token`).
Init: normal(0.02) everywhere, 0.02 / sqrt(2L) for projections into the residual stream.
Decoding: `decode=True` uses each attention layer's key/value cache ("cache" collection; see
transformer/layers/attention.py): init once with tokens of the full length, then feed new tokens;
their positions count on from the cached ones unless positions_BT is given (e.g. left padding).
"""
from __future__ import annotations

import flax.linen as nn
import jax

from transformer.layers.embeddings import OutputHead, TokenEmbedding
from transformer.spec import ModelConfig
from transformer.models.stack import embed_and_stack


class DecoderLM(nn.Module):
    """tokens_BT -> logits_BTV (float32). sow_attention_weights: store every layer's weights_BNTS
    in the "intermediates" collection (forces the einsum attention). return_hidden=True: the final
    (normed) hidden states x_BTD instead, which `output_logits` turns into the logits (chunked loss)."""

    cfg: ModelConfig
    sow_attention_weights: bool = False

    @nn.compact
    def __call__(self, tokens_BT: jax.Array, positions_BT: jax.Array | None = None,
                 segment_ids_BT: jax.Array | None = None, *, deterministic: bool = True,
                 decode: bool = False, return_hidden: bool = False) -> jax.Array:
        cfg = self.cfg
        embedding = TokenEmbedding(cfg, name="token_embedding")
        x_BTD = embed_and_stack(self, cfg, embedding, tokens_BT, positions_BT, segment_ids_BT, causal=True,
                                sow_weights=self.sow_attention_weights, deterministic=deterministic,
                                decode=decode)
        if return_hidden:  # the final hidden states x_BTD; `output_logits` applies the head to them
            return x_BTD
        logits_BTV = embedding.attend(x_BTD) if cfg.tie_embeddings else OutputHead(cfg, name="head")(x_BTD)
        return nn.with_logical_constraint(logits_BTV, ("batch", "seq", "act_vocab"))


def output_logits(cfg: ModelConfig, params: dict, x_BTD: jax.Array) -> jax.Array:
    """Step 6 alone: a DecoderLM's output head (tied or not) applied to hidden states x_B...D -> logits
    (float32), from the model's parameters. `apply(..., return_hidden=True)` then this equals `apply`."""
    if cfg.tie_embeddings:
        return TokenEmbedding(cfg).apply({"params": params["token_embedding"]}, x_BTD, method="attend")
    return OutputHead(cfg).apply({"params": params["head"]}, x_BTD)
