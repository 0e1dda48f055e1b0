"""The Transformer block and the layer stack shared by every model family.

Legend: B batch, T sequence, S context (encoder) sequence, D model width, L layers.

A block is self-attention, optionally cross-attention, then the feed-forward layer; each sub-layer
sits in a residual branch with its norm before it (pre-LN: x + f(norm(x))) or after the sum
(post-LN: norm(x + f(x))) and dropout on its output. cfg.parallel_block (GPT-J, PaLM; pre-LN only):
x + attention(norm(x)) + ffn(norm(x)), ONE norm ("norm") read by both, no "attention_norm"/"mlp_norm". The decoder, the encoder and the
encoder–decoder all stack this block with `BlockStack`; no family has its own attention or FFN.

BlockStack options (from ModelConfig):
  remat        "none" | "full" | "dots" | "dots_no_batch" | "dots_no_batch_attention": nn.remat with no
               policy (recompute all), jax.checkpoint_policies.checkpoint_dots, ..._dots_with_no_batch_dims,
               or that plus each attention layer's output (named ATTENTION_OUT in layers/attention.py), so
               that the backward pass does not recompute the attention (MaxText's "minimal_with_context").
  scan_layers  True: one block traced once and scanned L times (nn.scan); parameters are stacked
               with a leading axis of logical name "layers" (shape L,...). Compiles in O(1) of L.
               False: blocks "layers_0" ... "layers_{L-1}".
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax

from transformer.layers.attention import HEAD_MASK, MultiHeadAttention, check_cache_room
from transformer.layers.sdpa import ATTENTION_OUT
from transformer.layers.feedforward import FeedForward
from transformer.layers.norms import make_norm
from transformer.spec import ModelConfig

LAYERS_AXIS = "layers"  # logical name of the stacked-layer axis under scan_layers (maps to no mesh axis)

REMAT_POLICIES = {
    "full": None,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    "dots_no_batch_attention": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
        jax.checkpoint_policies.save_only_these_names(ATTENTION_OUT)),
}


def residual_out_std(cfg: ModelConfig) -> float:
    """GPT-2 init of the projections that write into the residual stream: 0.02 / sqrt(2 L)."""
    return 0.02 / math.sqrt(2 * cfg.num_layers)


class TransformerBlock(nn.Module):
    """x_BTD -> x_BTD. All call arguments are positional so that remat/scan can handle them."""

    cfg: ModelConfig
    causal: bool
    cross_attention: bool = False
    sow_weights: bool = False
    scan_output: bool = False  # return (x_BTD, None), the (carry, output) pair nn.scan expects

    @nn.compact
    def __call__(self, x_BTD: jax.Array, positions_BT: jax.Array | None = None,
                 segment_ids_BT: jax.Array | None = None, context_BSD: jax.Array | None = None,
                 context_segment_ids_BS: jax.Array | None = None, bias_1NTS: jax.Array | None = None,
                 deterministic: bool = True, decode: bool = False) -> jax.Array | tuple[jax.Array, None]:
        cfg = self.cfg
        out_std = residual_out_std(cfg)

        def sublayer(x: jax.Array, fn, name: str) -> jax.Array:
            norm = make_norm(cfg, f"{name}_norm")
            drop = nn.Dropout(cfg.dropout_rate, name=f"{name}_dropout")
            if cfg.norm_position == "pre":
                x = x + drop(fn(norm(x)), deterministic=deterministic)
            else:
                x = norm(x + drop(fn(x), deterministic=deterministic))
            return nn.with_logical_constraint(x, ("batch", "seq", "act_embed"))

        self_attn = MultiHeadAttention(cfg, causal=self.causal, out_std=out_std, sow_weights=self.sow_weights,
                                       check_cache=not self.scan_output, name="attention")
        if cfg.parallel_block:  # ModelConfig allows it pre-LN, without cross-attention
            h_BTD = make_norm(cfg, "norm")(x_BTD)
            attn_BTD = nn.Dropout(cfg.dropout_rate, name="attention_dropout")(
                self_attn(h_BTD, positions_BT, segment_ids_BT, bias_BNTS=bias_1NTS, decode=decode,
                          deterministic=deterministic), deterministic=deterministic)
            mlp_BTD = nn.Dropout(cfg.dropout_rate, name="mlp_dropout")(
                FeedForward(cfg, out_std=out_std, name="mlp")(h_BTD, deterministic), deterministic=deterministic)
            x_BTD = nn.with_logical_constraint(x_BTD + attn_BTD + mlp_BTD, ("batch", "seq", "act_embed"))
            return (x_BTD, None) if self.scan_output else x_BTD
        x_BTD = sublayer(x_BTD, lambda h: self_attn(h, positions_BT, segment_ids_BT, bias_BNTS=bias_1NTS,
                                                     decode=decode, deterministic=deterministic), "attention")
        if self.cross_attention:
            if context_BSD is None:
                raise ValueError("a cross-attention block needs context_BSD")
            cross_attn = MultiHeadAttention(cfg, causal=False, out_std=out_std, sow_weights=self.sow_weights,
                                            name="cross_attention")
            x_BTD = sublayer(x_BTD, lambda h: cross_attn(h, positions_BT, segment_ids_BT, context_BSD,
                                                         context_segment_ids_BS, decode=decode,
                                                         deterministic=deterministic), "cross_attention")
        mlp = FeedForward(cfg, out_std=out_std, name="mlp")
        x_BTD = sublayer(x_BTD, lambda h: mlp(h, deterministic), "mlp")
        return (x_BTD, None) if self.scan_output else x_BTD


class BlockStack(nn.Module):
    """cfg.num_layers (or `num_layers`) TransformerBlocks, with the config's remat and scan options.
    bias_1NTS (a position bias, made once by the stack) goes to every block's self-attention."""

    cfg: ModelConfig
    causal: bool
    cross_attention: bool = False
    num_layers: int = 0  # 0: cfg.num_layers
    sow_weights: bool = False

    @nn.compact
    def __call__(self, x_BTD: jax.Array, positions_BT: jax.Array | None = None,
                 segment_ids_BT: jax.Array | None = None, context_BSD: jax.Array | None = None,
                 context_segment_ids_BS: jax.Array | None = None, bias_1NTS: jax.Array | None = None,
                 deterministic: bool = True, decode: bool = False) -> jax.Array:
        cfg = self.cfg
        num_layers = self.num_layers or cfg.num_layers
        block_cls = TransformerBlock
        if cfg.remat != "none":
            # deterministic and decode (the last two arguments) are Python bools: static under remat.
            block_cls = nn.remat(block_cls, policy=REMAT_POLICIES[cfg.remat], prevent_cse=not cfg.scan_layers,
                                 static_argnums=(-2, -1))
        args = (positions_BT, segment_ids_BT, context_BSD, context_segment_ids_BS, bias_1NTS, deterministic, decode)
        kwargs = dict(causal=self.causal, cross_attention=self.cross_attention, sow_weights=self.sow_weights,
                      scan_output=cfg.scan_layers)
        if cfg.scan_layers:
            if decode:
                _check_scanned_cache_room(self, x_BTD.shape[1])
            scanned = nn.scan(block_cls,
                              variable_axes={"params": 0, "cache": 0, "intermediates": 0, HEAD_MASK: 0},
                              split_rngs={"params": True, "dropout": True},
                              in_axes=(nn.broadcast,) * len(args), length=num_layers,
                              metadata_params={nn.PARTITION_NAME: LAYERS_AXIS})
            x_BTD, _ = scanned(cfg, name="layers", **kwargs)(x_BTD, *args)
            return x_BTD
        for i in range(num_layers):
            x_BTD = block_cls(cfg, name=f"layers_{i}", **kwargs)(x_BTD, *args)
        return x_BTD


def _check_scanned_cache_room(stack: nn.Module, T: int) -> None:
    """The scanned layers' self-attention caches share one write index (cache_index, shape L): check once,
    here outside nn.scan, that T more tokens fit (the blocks skip their own check: a host callback inside the
    scanned body fails under jax 0.11). Nothing to check while the cache is being created."""
    cache = stack.variables.get("cache", {}).get("layers", {}).get("attention")
    if cache is not None:
        check_cache_room(cache["cache_index"][0], T, cache["cached_key"].shape[-3])
