"""Hugging Face checkpoints <-> this codebase's models (extra `[hf]`: torch, transformers, safetensors).

`from_pretrained(PATH) -> (model, params)`: a local checkpoint directory (config.json plus
model.safetensors, pytorch_model.bin, or their sharded index) of GPT-2, LLaMA, Qwen3, GPT-NeoX, BERT or
T5 becomes a ModelConfig, its Flax module (DecoderLM / EncoderModel / EncoderDecoderModel) and float32 parameters,
so that `model.apply({"params": params}, tokens_BT)` (T5: `(src_BS, tgt_BT)`) gives the checkpoint's
logits. Pass `positions_BT, segment_ids_BT` (segment id 0 = padding, as an attention mask) for padded
batches (T5: `src_segment_ids_BS, tgt_segment_ids_BT`).

`to_pretrained(model, params, PATH)` writes PATH/config.json and PATH/model.safetensors that
`transformers` loads with AutoModelFor{CausalLM,MaskedLM,Seq2SeqLM}.from_pretrained(PATH); the family
is chosen from the config (GPT-2: learned positions + LayerNorm + tied head; LLaMA: RoPE + RMSNorm +
gated FFN; Qwen3: LLaMA with qk_norm; GPT-NeoX: parallel_block; BERT: a post-LN encoder with an embedding norm; T5: an encoder–decoder with T5's relative
position bias). Importing what was exported gives back exactly the same parameters (T5: the same
logits; exactly the same parameters for a model that came from T5). `token_ids` sets the special ids
of the written config (bos/eos/pad/decoder_start_token_id), e.g. a run's tokenizer's.
A model with pruned heads (model.pruned_heads) is written with the removed heads as zero rows of its attention
kernels (Hugging Face's layouts have one head count for every layer): the same function, the unpruned shape.
Export refuses (ConfigError, nothing written) a model with a parameter the family's converter does not read
(`hf_tensors`): an option a layout lacks is never dropped silently.

The per-family name/shape mappings live in hf_gpt2.py, hf_llama.py, hf_qwen3.py, hf_gpt_neox.py, hf_bert.py
and hf_t5.py.
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

from transformer.interop import hf_bert, hf_gpt2, hf_gpt_neox, hf_llama, hf_qwen3, hf_t5, layouts
from transformer.interop import tensors as t
from transformer.layers import head_pruning
from transformer.models import build_model
from transformer.spec import ConfigError, ModelConfig

CONVERTERS: dict[str, ModuleType] = {"gpt2": hf_gpt2, "llama": hf_llama, "bert": hf_bert, "t5": hf_t5, "qwen3": hf_qwen3,
                                     "gpt_neox": hf_gpt_neox}
# Families whose config depends on the weights too: T5's head is its own exactly when the checkpoint holds
# an lm_head.weight that differs from the token table (transformers 5.x's rule).
NEEDS_WEIGHTS = ("t5",)


def _converter(path: str) -> tuple[dict[str, Any], ModuleType]:
    c = t.read_config(path)
    model_type = c.get("model_type")
    if model_type not in CONVERTERS:
        raise ConfigError(f"{path}: model_type={model_type!r} is not supported; supported: {', '.join(CONVERTERS)}")
    return c, CONVERTERS[model_type]


def config_from_pretrained(path: str, state: dict[str, np.ndarray] | None = None) -> ModelConfig:
    """The ModelConfig of the checkpoint in PATH (weights read only for T5, unless `state` is given)."""
    c, converter = _converter(path)
    if c["model_type"] in NEEDS_WEIGHTS:
        return converter.config_from_hf(c, t.load_state_dict(path) if state is None else state)
    return converter.config_from_hf(c)


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
    """(model, params) from a local Hugging Face checkpoint directory of GPT-2, LLaMA, BERT or T5."""
    _, converter = _converter(path)
    state = t.load_state_dict(path)
    cfg = config_from_pretrained(path, state)
    params = converter.params_from_hf(state, cfg)
    model = build_model(cfg)
    _check_shapes(model, params)
    return model, jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), params)


def converter_for(cfg: ModelConfig) -> tuple[str, ModuleType]:
    """The Hugging Face family whose layout fits this config; a model no layout fits is refused (ConfigError
    naming the closest layouts' unmet settings, layouts.unmet). hf_tensors then refuses settings the mapping
    does not read."""
    if cfg.parametrization != "sp":
        raise ConfigError("model.parametrization='mup' has no Hugging Face counterpart: a μP model multiplies its "
                          "logits by mup_base_width / d_model (and may rescale attention), which GPT-2/LLaMA/BERT "
                          "do not")
    misses = {name: layouts.unmet(cfg, converter.NEEDS) for name, converter in CONVERTERS.items()}
    name = next((n for n, miss in misses.items() if not miss), None)
    if name is None:
        closest = sorted((n for n in CONVERTERS if cfg.family == CONVERTERS[n].NEEDS["family"]),
                         key=lambda n: len(misses[n]))[:2]
        raise ConfigError("this model has no Hugging Face counterpart here: "
                          + "; ".join(f"{n} needs {', '.join(misses[n])}" for n in closest)
                          if closest else f"model.family={cfg.family!r} has no Hugging Face counterpart here")
    return name, CONVERTERS[name]


def hf_tensors(name: str, converter: ModuleType, params: dict[str, Any], cfg: ModelConfig) -> dict[str, np.ndarray]:
    """converter.params_to_hf(params), refused (ConfigError naming what is wrong) unless the mapping reads
    every parameter of the model and every setting away from its default (layouts.unhandled: its NEEDS,
    config_to_hf and params_to_hf, recorded as they read the config): an option the converter does not know (a
    norm, a bias, a table, or a setting without parameters such as a scale) must not be dropped silently. A
    parameter the layout needs but the model lacks is refused too."""
    tracked, recorder = t.TrackedParams(params), layouts.ReadRecorder(cfg)
    layouts.unmet(recorder, converter.NEEDS)
    converter.config_to_hf(recorder)
    try:
        tensors = converter.params_to_hf(tracked, recorder)
    except t.MissingParameterError as e:
        raise ConfigError(f"this model cannot be written as Hugging Face {name}: the layout needs parameter "
                          f"{e.args[0]}, which the model does not have (check the model options against "
                          f"transformer/interop/hf_{name}.py)") from None
    unhandled = layouts.unhandled(cfg, recorder.read)
    if unhandled:
        raise ConfigError(f"{', '.join(unhandled)}: Hugging Face {name}'s mapping (transformer/interop/hf_{name}.py) "
                          f"does not read this setting, so the exported model could compute another function than "
                          f"this one; set it to its default, or teach the mapping (docs/extending.md)")
    unread = tracked.unread()
    if unread:
        shown = ", ".join(unread[:8]) + (f" and {len(unread) - 8} more" if len(unread) > 8 else "")
        raise ConfigError(f"this model cannot be written as Hugging Face {name}: its parameter(s) {shown} have no "
                          f"place in that layout (a model option {name} does not have?); nothing was written")
    return tensors


TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def to_pretrained(model: nn.Module, params: Any, path: str, *, token_ids: dict[str, int] | None = None) -> str:
    """Write PATH/config.json and PATH/model.safetensors (float32); returns PATH. token_ids: special ids
    (keys of TOKEN_ID_KEYS) that replace the family's defaults in config.json."""
    cfg: ModelConfig = model.cfg
    name, converter = converter_for(cfg)
    unknown = sorted(set(token_ids or {}) - set(TOKEN_ID_KEYS))
    if unknown:
        raise ValueError(f"token_ids keys {unknown} are not among {TOKEN_ID_KEYS}")
    params = t.unstack_layers(jax.tree.map(lambda a: np.asarray(jax.device_get(a), np.float32), nn.unbox(params)))
    if cfg.pruned_heads:  # one head count per model there: the removed heads as zero rows (the same function)
        cfg, params = head_pruning.zero_padded(cfg, params)
        name, converter = converter_for(cfg)
    tensors = hf_tensors(name, converter, params, cfg)
    hf_config = {**converter.config_to_hf(cfg), "dtype": "float32", **(token_ids or {})}
    os.makedirs(path, exist_ok=True)
    t.save_state_dict(tensors, path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)
    return path
