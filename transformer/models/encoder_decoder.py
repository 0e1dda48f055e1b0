"""An encoder–decoder Transformer (Vaswani et al. 2017; T5 shapes are configs, not code).

Legend: B batch, S source (encoder) sequence, T target (decoder) sequence, D model width, V vocabulary.

Reading top to bottom:
  1. one token table ("vocab", "embed") shared by the source, the target and (tied) the output head
  2. encoder = EmbeddedStack(causal=False) from transformer/models/encoder.py: absolute positions
     (each stack has its own learned table, as BART; sinusoidal needs none; RoPE rotates q and k) ->
     optional embedding norm -> cfg.encoder_layers bidirectional TransformerBlocks -> final norm
     (pre-LN) -> encoded_BSD
  3. decoder = EmbeddedStack(causal=True, cross_attention=True): cfg.num_layers blocks of causal
     self-attention, cross-attention to encoded_BSD and a feed-forward layer -> final norm (pre-LN)
  4. output head: the token table transposed (tied) or an ("embed", "vocab") kernel -> logits_BTV
     (float32); with scale_tied_head (T5 v1.0) the hidden states are multiplied by D^-0.5 first.
Masks: source segment ids (0 = padding) keep padded source positions out of encoder self-attention
and out of the decoder's cross-attention; target segment ids do the same for the decoder. When only
the source's are given, every target token counts as segment 1 (one unpacked example per row).
RoPE, where configured, rotates self-attention only; a position bias (positional=t5_relative, T5's
buckets: bidirectional in the encoder, unidirectional in the decoder; or alibi) is computed once per
stack and added in every self-attention layer of that stack. Cross-attention carries no positions.

Parameters: token_embedding/embedding, encoder/{position_embedding | relative_position_bias,
embedding_norm, blocks/layers_i/{attention, attention_norm, mlp, mlp_norm}, final_norm},
decoder/{..., blocks/layers_i/{cross_attention, cross_attention_norm}}, head/kernel (untied only);
transformer/interop/hf_t5.py maps them to Hugging Face T5's names.

Decoding (what transformer/inference builds on): `encode` once, then `decode(..., decode=True)`
token by token with the decoder's self-attention key/value cache (the "cache" collection). Create
the empty cache with `model.apply(variables, tgt_BT, encoded_BSD, src_segment_ids_BS, decode=True,
method="decode", mutable=["cache"])` where tgt_BT has the full decoding length; each later call
appends its tokens, whose positions count on from the cached ones unless tgt_positions_BT is given.
Cross-attention keys and values are projected from encoded_BSD once, by that first call, and reused.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.layers.embeddings import OutputHead, TokenEmbedding
from transformer.spec import ModelConfig
from transformer.models.encoder import EmbeddedStack


class EncoderDecoderModel(nn.Module):
    """(src_tokens_BS, tgt_tokens_BT) -> logits_BTV (float32); `encode` and `decode` are its halves."""

    cfg: ModelConfig
    sow_attention_weights: bool = False

    def setup(self) -> None:
        cfg = self.cfg
        self.token_embedding = TokenEmbedding(cfg)
        self.encoder = EmbeddedStack(cfg, self.token_embedding, causal=False, num_layers=cfg.encoder_layers,
                                     sow_attention_weights=self.sow_attention_weights)
        self.decoder = EmbeddedStack(cfg, self.token_embedding, causal=True, cross_attention=True,
                                     num_layers=cfg.num_layers, sow_attention_weights=self.sow_attention_weights)
        if not cfg.tie_embeddings:
            self.head = OutputHead(cfg)

    def encode(self, src_tokens_BS: jax.Array, src_segment_ids_BS: jax.Array | None = None,
               src_positions_BS: jax.Array | None = None, *, deterministic: bool = True) -> jax.Array:
        """src_tokens_BS -> encoded_BSD."""
        return self.encoder(src_tokens_BS, src_positions_BS, src_segment_ids_BS, deterministic=deterministic)

    def decode(self, tgt_tokens_BT: jax.Array, encoded_BSD: jax.Array, src_segment_ids_BS: jax.Array | None = None,
               tgt_positions_BT: jax.Array | None = None, tgt_segment_ids_BT: jax.Array | None = None, *,
               deterministic: bool = True, decode: bool = False) -> jax.Array:
        """(tgt_tokens_BT, encoded_BSD) -> logits_BTV; decode=True uses and extends the self-attention cache."""
        x_BTD = self.decoder(tgt_tokens_BT, tgt_positions_BT, tgt_segment_ids_BT, encoded_BSD, src_segment_ids_BS,
                             deterministic=deterministic, decode=decode)
        if self.cfg.scale_tied_head:  # T5 v1.0 (Mesh TensorFlow): the tied head sees hidden × D^-0.5
            x_BTD = x_BTD * jnp.asarray(self.cfg.d_model ** -0.5, x_BTD.dtype)
        logits_BTV = self.token_embedding.attend(x_BTD) if self.cfg.tie_embeddings else self.head(x_BTD)
        return nn.with_logical_constraint(logits_BTV, ("batch", "seq", "act_vocab"))

    def __call__(self, src_tokens_BS: jax.Array, tgt_tokens_BT: jax.Array,
                 src_segment_ids_BS: jax.Array | None = None, tgt_segment_ids_BT: jax.Array | None = None,
                 src_positions_BS: jax.Array | None = None, tgt_positions_BT: jax.Array | None = None, *,
                 deterministic: bool = True) -> jax.Array:
        """Teacher-forced logits_BTV for the target tokens given the source."""
        encoded_BSD = self.encode(src_tokens_BS, src_segment_ids_BS, src_positions_BS, deterministic=deterministic)
        return self.decode(tgt_tokens_BT, encoded_BSD, src_segment_ids_BS, tgt_positions_BT, tgt_segment_ids_BT,
                           deterministic=deterministic)
