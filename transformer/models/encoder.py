"""An encoder-only Transformer (BERT): masked-LM logits, or class logits with a pooler and classifier.

Legend: B batch, T sequence, D model width (d_model), V vocabulary, C classes, L layers.

Reading top to bottom:
  1. `EmbeddedStack` (shared with the encoder–decoder): tokens_BT -> token embedding (the shared
     table passed in; × sqrt(D) if scale_embeddings) + absolute positions (learned | sinusoidal;
     RoPE rotates q and k inside attention instead) -> optional embedding norm -> dropout ->
     L × TransformerBlock from transformer/models/blocks.py, here bidirectional (causal=False):
     every token sees every token of its own segment (segment ids; 0 = padding) -> final norm
     (pre-LN only: post-LN blocks already end with a norm).
  2a. num_classes == 0: the BERT masked-LM head: dense D->D + activation + norm, then the tied
     decoder (token table transposed; an untied ("embed","vocab") kernel otherwise) + an output bias
     (V, with use_bias) -> logits_BTV (float32).
  2b. num_classes > 0: the BERT pooler (dense D->D + tanh on the first token) + dropout + classifier
     (D->C) -> logits_BC (float32). There is no masked-LM head then (as HF BertForSequenceClassification).

BERT (configs/mlm.py:bert_*) = learned positions, embedding LayerNorm, post-LN LayerNorm blocks
with biases, exact-erf GELU, tied head. HF BERT's token-type embeddings are not modelled: an
importer folds type 0 into the position table (position_embedding += token_type_embeddings[0]).

Parameter tree (what transformer/interop/hf.py maps; kernels are (in, out), attention kernels are
split per head):
  token_embedding/embedding                       (V, D)     bert.embeddings.word_embeddings
  encoder/position_embedding/embedding            (max_len, D)  bert.embeddings.position_embeddings
  encoder/embedding_norm/{scale,bias}             (D,)       bert.embeddings.LayerNorm
  encoder/blocks/layers_{i}/attention/{query,key,value}/kernel (D, N, H), bias (N, H)
                                                             ...attention.self.{query,key,value}
  encoder/blocks/layers_{i}/attention/out/kernel  (N, H, D), bias (D,)   ...attention.output.dense
  encoder/blocks/layers_{i}/attention_norm/{scale,bias}      ...attention.output.LayerNorm
  encoder/blocks/layers_{i}/mlp/wi/{kernel (D, F), bias}     ...intermediate.dense
  encoder/blocks/layers_{i}/mlp/wo/{kernel (F, D), bias}     ...output.dense
  encoder/blocks/layers_{i}/mlp_norm/{scale,bias}            ...output.LayerNorm
  encoder/final_norm                              pre-LN only (no BERT counterpart)
  mlm_head/transform/{kernel (D, D), bias}        cls.predictions.transform.dense
  mlm_head/transform_norm/{scale,bias}            cls.predictions.transform.LayerNorm
  mlm_head/output_bias                            (V,)       cls.predictions.bias (decoder tied)
  mlm_head/head/kernel                            (D, V)     untied only
  pooler/{kernel (D, D), bias}                    bert.pooler.dense
  classifier/{kernel (D, C), bias}                classifier
With scan_layers the blocks are encoder/blocks/layers/... stacked along a leading L axis.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer.layers import mup
from transformer.layers.dtypes import compute_dtypes
from transformer.layers.embeddings import OutputHead, TokenEmbedding
from transformer.layers.feedforward import ACTIVATIONS
from transformer.layers.norms import make_norm
from transformer.spec import ModelConfig
from transformer.models.stack import embed_and_stack


def _dense(cfg: ModelConfig, features: int, names: tuple[str, str], name: str) -> nn.Dense:
    dtype, param_dtype = compute_dtypes(cfg)
    return nn.Dense(features, use_bias=cfg.use_bias, dtype=dtype, param_dtype=param_dtype,
                    kernel_init=nn.with_logical_partitioning(nn.initializers.normal(0.02), names),
                    bias_init=nn.with_logical_partitioning(nn.initializers.zeros, names[1:]), name=name)


class EmbeddedStack(nn.Module):
    """tokens_BT -> hidden x_BTD: embeddings, a BlockStack and the final norm (step 1 above).

    `embedding` is a TokenEmbedding owned by the parent, so that several stacks can share one table.
    With cross_attention, context_BSD (and its segment ids, 0 = padding) feeds every block's
    cross-attention. decode=True: self-attention key/value caches; positions count on from the cache.
    """

    cfg: ModelConfig
    embedding: TokenEmbedding
    causal: bool
    cross_attention: bool = False
    num_layers: int = 0  # 0: cfg.num_layers
    sow_attention_weights: bool = False

    @nn.compact
    def __call__(self, tokens_BT: jax.Array, positions_BT: jax.Array | None = None,
                 segment_ids_BT: jax.Array | None = None, context_BSD: jax.Array | None = None,
                 context_segment_ids_BS: jax.Array | None = None, *, deterministic: bool = True,
                 decode: bool = False) -> jax.Array:
        return embed_and_stack(self, self.cfg, self.embedding, tokens_BT, positions_BT, segment_ids_BT,
                               context_BSD, context_segment_ids_BS, causal=self.causal,
                               cross_attention=self.cross_attention, num_layers=self.num_layers,
                               sow_weights=self.sow_attention_weights, deterministic=deterministic,
                               decode=decode)


class MLMHead(nn.Module):
    """x_BTD -> logits_BTV (float32): dense + activation + norm, the (tied) decoder, an output bias."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BTD: jax.Array, embedding: TokenEmbedding) -> jax.Array:
        cfg = self.cfg
        h_BTD = ACTIVATIONS[cfg.activation](_dense(cfg, cfg.d_model, ("embed", "mlp"), "transform")(x_BTD))
        h_BTD = make_norm(cfg, "transform_norm")(h_BTD)
        logits_BTV = embedding.attend(h_BTD) if cfg.tie_embeddings else OutputHead(cfg, name="head")(h_BTD)
        if cfg.use_bias:
            bias_V = self.param("output_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
                                (cfg.vocab_size,), compute_dtypes(cfg)[1])
            logits_BTV = logits_BTV + bias_V.astype(jnp.float32)
        return logits_BTV


class EncoderModel(nn.Module):
    """tokens_BT -> masked-LM logits_BTV, or class logits_BC when cfg.num_classes > 0 (both float32)."""

    cfg: ModelConfig
    sow_attention_weights: bool = False

    @nn.compact
    def __call__(self, tokens_BT: jax.Array, positions_BT: jax.Array | None = None,
                 segment_ids_BT: jax.Array | None = None, *, deterministic: bool = True) -> jax.Array:
        cfg = self.cfg
        embedding = TokenEmbedding(cfg, name="token_embedding")
        x_BTD = EmbeddedStack(cfg, embedding, causal=False, sow_attention_weights=self.sow_attention_weights,
                              name="encoder")(tokens_BT, positions_BT, segment_ids_BT, deterministic=deterministic)
        if cfg.num_classes:
            pooled_BD = jnp.tanh(_dense(cfg, cfg.d_model, ("embed", "mlp"), "pooler")(x_BTD[:, 0]))
            pooled_BD = nn.Dropout(cfg.dropout_rate)(pooled_BD, deterministic=deterministic)
            # μP's output multiplier on the readout's product, not its bias: (x / m) W + b (SP: x as it is)
            classifier = _dense(cfg, cfg.num_classes, ("mlp", "classes"), "classifier")
            logits_BC = classifier(mup.scale_logits(cfg, pooled_BD))
            return logits_BC.astype(jnp.float32)
        logits_BTV = MLMHead(cfg, name="mlm_head")(x_BTD, embedding)
        return nn.with_logical_constraint(logits_BTV, ("batch", "seq", "act_vocab"))
