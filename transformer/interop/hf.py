"""Hugging Face checkpoints <-> this codebase's models (extra `[hf]`: torch, transformers, safetensors).

`from_pretrained(PATH) -> (model, params)`: a local checkpoint directory (config.json plus
model.safetensors, pytorch_model.bin, or their sharded index) of GPT-2, LLaMA or BERT becomes a
ModelConfig, its Flax module (DecoderLM / EncoderModel) and float32 parameters, so that
`model.apply({"params": params}, tokens_BT)` gives the checkpoint's logits. Pass
`positions_BT, segment_ids_BT` (segment id 0 = padding, as an attention mask) for padded batches.

`to_pretrained(model, params, PATH)` writes PATH/config.json and PATH/model.safetensors that
`transformers` loads with AutoModelFor{CausalLM,MaskedLM}.from_pretrained(PATH); the family is
chosen from the config (GPT-2: learned positions + LayerNorm + tied head; LLaMA: RoPE + RMSNorm +
gated FFN; BERT: a post-LN encoder with an embedding norm). Importing what was exported gives back
exactly the same parameters.

The per-family name/shape mappings live in hf_gpt2.py, hf_llama.py and hf_bert.py.
"""
from __future__ import annotations

import json
import os
from types import ModuleType
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer.interop import hf_bert, hf_gpt2, hf_llama
from transformer.interop import tensors as t
from transformer.models import build_model
from transformer.config import ConfigError, ModelConfig

CONVERTERS: dict[str, ModuleType] = {"gpt2": hf_gpt2, "llama": hf_llama, "bert": hf_bert}


def config_from_pretrained(path: str) -> ModelConfig:
    """The ModelConfig of the checkpoint in PATH (no weights read)."""
    c = t.read_config(path)
    model_type = c.get("model_type")
    if model_type not in CONVERTERS:
        raise ConfigError(f"{path}: model_type={model_type!r} is not supported; supported: {', '.join(CONVERTERS)}")
    return CONVERTERS[model_type].config_from_hf(c)


def _check_shapes(model: nn.Module, params: Any) -> None:
    """The converted tree must be exactly what the module creates (names and shapes)."""
    cfg = model.cfg
    init_args = ((jnp.zeros((1, 2), jnp.int32),) * (2 if cfg.family == "encoder_decoder" else 1))
    expected = nn.unbox(jax.eval_shape(lambda r: model.init(r, *init_args), jax.random.PRNGKey(0))["params"])
    want = {"/".join(str(getattr(k, "key", k)) for k in path): a.shape
            for path, a in jax.tree_util.tree_flatten_with_path(expected)[0]}
    got = {"/".join(str(getattr(k, "key", k)) for k in path): np.shape(a)
           for path, a in jax.tree_util.tree_flatten_with_path(params)[0]}
    if want != got:
        diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        raise ValueError("converted parameters do not fit the model: "
                         + "; ".join(f"{k}: model {want.get(k)}, converted {got.get(k)}" for k in diff[:6]))


def from_pretrained(path: str) -> tuple[nn.Module, Any]:
    """(model, params) from a local Hugging Face checkpoint directory of GPT-2, LLaMA or BERT."""
    cfg = config_from_pretrained(path)
    converter = CONVERTERS[t.read_config(path)["model_type"]]
    params = converter.params_from_hf(t.load_state_dict(path), cfg)
    model = build_model(cfg)
    _check_shapes(model, params)
    return model, jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)


def converter_for(cfg: ModelConfig) -> tuple[str, ModuleType]:
    """The Hugging Face family that can hold a model of this config."""
    if cfg.parametrization != "sp":
        raise ConfigError("a μP model (model.parametrization='mup') multiplies its logits by mup_base_width / "
                          "d_model (and may rescale attention); Hugging Face's GPT-2/LLaMA/BERT have no such "
                          "multipliers, so it has no counterpart there")
    for name, converter in CONVERTERS.items():
        if converter.matches(cfg):
            return name, converter
    raise ConfigError(
        "this model has no Hugging Face counterpart here: GPT-2 needs a decoder with learned positions, pre-LN "
        "LayerNorm, gelu/gelu_tanh/relu, biases, a tied head and multi-head attention; LLaMA a decoder with RoPE, "
        "pre-LN RMSNorm and swiglu/geglu; BERT an encoder with learned positions, an embedding norm, post-LN "
        f"LayerNorm, biases, a tied masked-LM head (got {cfg})")


def to_pretrained(model: nn.Module, params: Any, path: str) -> str:
    """Write PATH/config.json and PATH/model.safetensors (float32); returns PATH."""
    cfg: ModelConfig = model.cfg
    name, converter = converter_for(cfg)
    params = t.unstack_layers(jax.tree.map(lambda a: np.asarray(jax.device_get(a), np.float32), params))
    tensors = converter.params_to_hf(params, cfg)
    hf_config = dict(converter.config_to_hf(cfg), dtype="float32")
    os.makedirs(path, exist_ok=True)
    t.save_state_dict(tensors, path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)
    return path
