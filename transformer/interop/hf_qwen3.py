"""Qwen3 (Hugging Face Qwen3ForCausalLM / Qwen3Model) <-> DecoderLM with model.qk_norm=True.

Qwen3 is the LLaMA layout (hf_llama.py: RoPE, pre-LN RMSNorm, SwiGLU, grouped-query attention) plus an
RMSNorm over each head's queries and keys (q_norm, k_norm: one scale of head_dim shared by the heads, applied
before RoPE), which is model.qk_norm. Its feed-forward layer has no biases whatever attention_bias says, so only
models without biases (use_bias=False) fit; sliding-window layers (use_sliding_window) are not supported.

  model.layers.{i}.self_attn.q_norm / k_norm  blocks/layers_{i}/attention/query_norm / key_norm (scale (H,))
  everything else                             as hf_llama.py

(OLMo-2 also has a QK-norm, but over all heads' queries together (N·H scales, not H) and with its norms after
each sub-layer instead of before: a different model, not this one.)
"""
from __future__ import annotations

from typing import Any

import numpy as np

from transformer.interop import hf_llama
from transformer.spec import ConfigError, ModelConfig


def config_from_hf(c: dict[str, Any]) -> ModelConfig:
    if c.get("attention_bias"):
        raise ConfigError("Qwen3 attention_bias=True is not supported: its feed-forward layer has no biases, and "
                          "this codebase has one use_bias for both")
    if c.get("use_sliding_window"):
        raise ConfigError("Qwen3 use_sliding_window=True is not supported (its windows apply to some layers only)")
    return hf_llama.config_from_hf({**c, "attention_bias": False, "mlp_bias": False}).replace(qk_norm=True)


NEEDS = dict(hf_llama.LAYOUT, qk_norm=True, use_bias=False)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    c = hf_llama.config_to_hf(cfg)
    del c["mlp_bias"]
    return {**c, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "attention_bias": False,
            "use_sliding_window": False}


def params_from_hf(state: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, Any]:
    return hf_llama.params_from_hf(state, cfg)


def params_to_hf(params: dict[str, Any], cfg: ModelConfig) -> dict[str, np.ndarray]:
    return hf_llama.params_to_hf(params, cfg)
