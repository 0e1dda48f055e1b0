"""Encoder-only masked LMs (BERT shapes, a modern pre-LN RoPE shape) and classification fine-tuning.

Usage: --config=configs/mlm.py[:PRESET[,classify]], PRESET one of PRESETS below; no preset gives
`default` (bert_tiny's shape, trains on CPU in a few minutes). `,classify` switches to the
classification task (train.task=classify, model.num_classes = len(data.classes)); equivalently
--config.train.task=classify --config.model.num_classes=6.
"""
from __future__ import annotations

import ml_collections

from configs.common import base_config
from transformer.spec import model_defaults
from transformer.data.classification import DEFAULT_CLASSES
from transformer.spec import ConfigError

# The BERT shape: learned positions, embedding LayerNorm, post-LN LayerNorm (eps 1e-12), exact GELU,
# biases, tied MLM decoder.
BERT = dict(positional="learned", norm="layernorm", norm_position="post", activation="gelu", embedding_norm=True,
            tie_embeddings=True, use_bias=True, norm_eps=1e-12, max_len=512)
# A modern encoder: RoPE, pre-LN RMSNorm, SwiGLU, no biases (ModernBERT-like, without its local attention).
MODERN = dict(positional="rope", norm="rmsnorm", norm_position="pre", activation="swiglu", embedding_norm=False,
              tie_embeddings=True, use_bias=False, norm_eps=1e-6, max_len=512)

PRESETS = {
    "default": dict(BERT, d_model=128, num_layers=2, num_heads=2, d_ff=512),
    "bert_tiny": dict(BERT, d_model=128, num_layers=2, num_heads=2, d_ff=512),      # google/bert_uncased_L-2_H-128_A-2
    "bert_small": dict(BERT, d_model=512, num_layers=4, num_heads=8, d_ff=2048),    # ..._L-4_H-512_A-8
    "bert_base": dict(BERT, d_model=768, num_layers=12, num_heads=12, d_ff=3072),   # bert-base-uncased
    "modern_tiny": dict(MODERN, d_model=128, num_layers=2, num_heads=2, d_ff=384),
}


def get_config(preset: str = "") -> ml_collections.ConfigDict:
    name, _, variant = (preset or "default").partition(",")
    if name not in PRESETS or variant not in ("", "classify"):
        raise ConfigError(f"unknown preset {preset!r} for configs/mlm.py; valid: {', '.join(PRESETS)}, "
                         f"each optionally followed by ',classify'")
    c = base_config()
    c.model = ml_collections.ConfigDict(model_defaults())  # every model setting, defaults from ModelConfig
    c.model.family = "encoder"
    c.model.vocab_size = 0  # 0: the tokenizer's vocabulary + MASK, padded to a multiple of 128
    c.model.update(PRESETS[name])
    c.data.seq_len = 128
    c.data.classes = DEFAULT_CLASSES  # the classification task's labels (top-level stdlib packages)
    c.train.task = "mlm"
    c.train.learning_rate = 1e-3
    c.train.b2 = 0.98
    c.train.weight_decay = 0.01
    if variant == "classify":
        c.train.task = "classify"
        c.model.num_classes = len(DEFAULT_CLASSES)
        c.train.steps = 300
        c.train.warmup_steps = 30
        c.train.eval_every = 100
        c.train.eval_steps = 16
    c.preset = preset or "default"
    return c
