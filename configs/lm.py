"""Decoder-only language models (GPT-2 / LLaMA shapes) on the built-in corpus.

Usage: --config=configs/lm.py[:PRESET], PRESET one of PRESETS below; no preset gives `default`,
a small GPT-2-shaped model. Any key can be overridden: --config.model.num_layers=8.
"""
from __future__ import annotations

import ml_collections

from configs.common import base_config
from transformer.spec import ConfigError, model_defaults

# The GPT-2 shape: learned positions, pre-LN LayerNorm, tanh-approximated GELU (GPT-2's "gelu_new"),
# biases, tied head.
GPT2 = dict(positional="learned", norm="layernorm", norm_position="pre", activation="gelu_tanh",
            tie_embeddings=True, use_bias=True)
# The LLaMA shape: RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases, untied head.
LLAMA = dict(positional="rope", norm="rmsnorm", norm_position="pre", activation="swiglu",
             tie_embeddings=False, use_bias=False, rope_base=10000.0, norm_eps=1e-6)

PRESETS = {
    "default": dict(GPT2, d_model=256, num_layers=4, num_heads=4, d_ff=1024),
    "gpt2_tiny": dict(GPT2, d_model=64, num_layers=2, num_heads=4, d_ff=256),
    "gpt2_small": dict(GPT2, d_model=768, num_layers=12, num_heads=12, d_ff=3072),
    "gpt2_medium": dict(GPT2, d_model=1024, num_layers=24, num_heads=16, d_ff=4096),
    "llama_tiny": dict(LLAMA, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2, d_ff=192),
    "llama_small": dict(LLAMA, d_model=512, num_layers=8, num_heads=8, num_kv_heads=4, d_ff=1408),
    # ~0.89B parameters with a 32k vocabulary (--config.model.vocab_size=32768): the GPU MFU benchmark shape.
    "llama_1b": dict(LLAMA, d_model=2048, num_layers=16, num_heads=16, num_kv_heads=8, d_ff=5632,
                     max_len=2048),
}


def get_config(preset: str = "") -> ml_collections.ConfigDict:
    preset = preset or "default"
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r} for configs/lm.py; valid presets: {', '.join(PRESETS)}")
    c = base_config()
    c.model = ml_collections.ConfigDict(model_defaults())  # every model setting, defaults from ModelConfig
    c.model.family = "decoder"
    c.model.vocab_size = 0  # 0: the tokenizer's vocabulary size
    c.model.update(PRESETS[preset])
    c.preset = preset
    return c
