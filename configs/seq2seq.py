"""Encoder–decoder Transformers (Vaswani and T5 shapes) trained with T5 span corruption.

Usage: --config=configs/seq2seq.py[:PRESET], PRESET one of PRESETS below; no preset gives `default`
(vaswani_tiny). data.seq_len is the encoder's input length; the target length follows from it
(transformer/data/span_corruption.py: 128 inputs <- 141-token rows; 29 targets, 7 sentinels).
"""
from __future__ import annotations

import ml_collections

from configs.common import base_config
from transformer.spec import ConfigError, model_defaults

# "Attention is all you need": sinusoidal positions, post-LN LayerNorm, ReLU, biases, embeddings × sqrt(D),
# one tied table for source, target and output.
VASWANI = dict(positional="sinusoidal", norm="layernorm", norm_position="post", activation="relu",
               scale_embeddings=True, tie_embeddings=True, use_bias=True)
# T5 v1.1-like: T5's bucketed relative position bias in self-attention (32 buckets, max distance 128; one
# table per stack, bidirectional in the encoder, unidirectional in the decoder; cross-attention has no
# positions), pre-LN RMSNorm, no biases, GeGLU, untied head. Unlike T5, q·k keeps its 1/sqrt(head_dim)
# (T5 folds it into its initialisation; export to Hugging Face folds it into the query kernels).
T5 = dict(positional="t5_relative", relative_num_buckets=32, relative_max_distance=128, norm="rmsnorm",
          norm_position="pre", activation="geglu", scale_embeddings=False, tie_embeddings=False, use_bias=False,
          norm_eps=1e-6)

PRESETS = {
    "default": dict(VASWANI, d_model=128, num_layers=2, num_encoder_layers=2, num_heads=4, d_ff=512),
    "vaswani_tiny": dict(VASWANI, d_model=128, num_layers=2, num_encoder_layers=2, num_heads=4, d_ff=512),
    "vaswani_base": dict(VASWANI, d_model=512, num_layers=6, num_encoder_layers=6, num_heads=8, d_ff=2048),
    "t5_tiny": dict(T5, d_model=128, num_layers=2, num_encoder_layers=2, num_heads=4, d_ff=320),
    "t5_small": dict(T5, d_model=512, num_layers=8, num_encoder_layers=8, num_heads=6, head_dim=64, d_ff=1024),
}


def get_config(preset: str = "") -> ml_collections.ConfigDict:
    preset = preset or "default"
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r} for configs/seq2seq.py; valid presets: {', '.join(PRESETS)}")
    c = base_config()
    c.model = ml_collections.ConfigDict(model_defaults())  # every model setting, defaults from ModelConfig
    c.model.family = "encoder_decoder"
    c.model.vocab_size = 0  # 0: the tokenizer's vocabulary + sentinels, padded to 128
    c.model.update(PRESETS[preset])
    c.data.seq_len = 128
    c.data.noise_density = 0.15
    c.data.mean_noise_span_length = 3.0
    c.train.task = "span_corruption"
    c.preset = preset
    return c
