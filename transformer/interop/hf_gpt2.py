"""GPT-2 (Hugging Face GPT2LMHeadModel / GPT2Model) <-> DecoderLM.

Shape: learned positions, pre-LN LayerNorm (eps = layer_norm_epsilon), "gelu_new" = our "gelu_tanh",
biases everywhere, head tied to the token table. Conv1D weights are already (in, out); c_attn holds
q, k, v side by side along its output axis.

  transformer.wte / wpe                       token_embedding/embedding, position_embedding/embedding
  transformer.h.{i}.ln_1 / ln_2               blocks/layers_{i}/attention_norm, mlp_norm
  transformer.h.{i}.attn.c_attn (D, 3D)       blocks/layers_{i}/attention/{query,key,value} (D, N, H)
  transformer.h.{i}.attn.c_proj (D, D)        blocks/layers_{i}/attention/out (N, H, D)
  transformer.h.{i}.mlp.c_fc / c_proj         blocks/layers_{i}/mlp/wi, wo
  transformer.ln_f                            final_norm
"""
from __future__ import annotations

from typing import Any

import numpy as np

from transformer.interop import tensors as t
from transformer.interop.layouts import FULL_WIDTH, MULTI_HEAD
from transformer.spec import ConfigError, ModelConfig

ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
EXPORT_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def config_from_hf(c: dict[str, Any]) -> ModelConfig:
    if c.get("scale_attn_by_inverse_layer_idx"):
        raise ConfigError("GPT-2 scale_attn_by_inverse_layer_idx=True is not supported (attention is scaled by "
                          "1/sqrt(head_dim) only)")
    if not c.get("scale_attn_weights", True):
        raise ConfigError("GPT-2 scale_attn_weights=False is not supported")
    if c.get("add_cross_attention"):
        raise ConfigError("GPT-2 add_cross_attention=True is not supported")
    act = c.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise ConfigError(f"GPT-2 activation_function={act!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    d = c["n_embd"]
    return ModelConfig(family="decoder", vocab_size=c["vocab_size"], d_model=d, num_layers=c["n_layer"],
                       num_heads=c["n_head"], d_ff=c.get("n_inner") or 4 * d, max_len=c["n_positions"],
                       positional="learned", activation=ACTIVATIONS[act], norm="layernorm", norm_position="pre",
                       norm_eps=c.get("layer_norm_epsilon", 1e-5), tie_embeddings=True, use_bias=True)


NEEDS = dict(family="decoder", positional="learned", norm="layernorm", norm_position="pre",
             activation=tuple(EXPORT_ACTIVATIONS), tie_embeddings=True, use_bias=True, num_kv_heads=MULTI_HEAD,
             head_dim=FULL_WIDTH, embedding_norm=False, scale_embeddings=False, sliding_window=0, qk_norm=False,
             parallel_block=False, attention_scale=0.0)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    return dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], vocab_size=cfg.vocab_size,
                n_embd=cfg.d_model, n_layer=cfg.num_layers, n_head=cfg.num_heads, n_inner=cfg.d_ff,
                n_positions=cfg.max_len, activation_function=EXPORT_ACTIVATIONS[cfg.activation],
                layer_norm_epsilon=cfg.norm_eps, tie_word_embeddings=True, bos_token_id=min(1, cfg.vocab_size - 1),
                eos_token_id=min(2, cfg.vocab_size - 1))


def params_from_hf(state: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, Any]:
    read = t.StateReader(t.strip_prefix(state, "transformer."), "GPT-2")
    N, D = cfg.num_heads, cfg.d_model
    blocks = {}
    for i in range(cfg.num_layers):
        p = f"h.{i}."
        qkv_w = np.split(read(p + "attn.c_attn.weight"), 3, axis=1)     # 3 × (D, D)
        qkv_b = np.split(read(p + "attn.c_attn.bias"), 3)
        attention = {name: {"kernel": t.to_heads_in(w, N), "bias": b.reshape(N, D // N)}
                     for name, w, b in zip(("query", "key", "value"), qkv_w, qkv_b)}
        attention["out"] = {"kernel": t.to_heads_out(read(p + "attn.c_proj.weight"), N),
                            "bias": read(p + "attn.c_proj.bias")}
        blocks[f"layers_{i}"] = {
            "attention_norm": read.layer_norm(p + "ln_1"), "attention": attention, "mlp_norm": read.layer_norm(p + "ln_2"),
            "mlp": {"wi": {"kernel": read(p + "mlp.c_fc.weight"), "bias": read(p + "mlp.c_fc.bias")},
                    "wo": {"kernel": read(p + "mlp.c_proj.weight"), "bias": read(p + "mlp.c_proj.bias")}}}
    params = {"token_embedding": {"embedding": read("wte.weight")},
              "position_embedding": {"embedding": read("wpe.weight")},
              "blocks": blocks, "final_norm": read.layer_norm("ln_f")}
    # the tied head (lm_head.weight, when saved) and the causal-mask buffers of old checkpoints
    read.check_all_used(ignore=("lm_head.weight", "attn.bias", "attn.masked_bias"))
    return params


def params_to_hf(params: dict[str, Any], cfg: ModelConfig) -> dict[str, np.ndarray]:
    out = {"transformer.wte.weight": params["token_embedding"]["embedding"],
           "transformer.wpe.weight": params["position_embedding"]["embedding"],
           "transformer.ln_f.weight": params["final_norm"]["scale"], "transformer.ln_f.bias": params["final_norm"]["bias"]}
    for i in range(cfg.num_layers):
        b, p = params["blocks"][f"layers_{i}"], f"transformer.h.{i}."
        a = b["attention"]
        out[p + "attn.c_attn.weight"] = np.concatenate([t.from_heads_in(a[n]["kernel"]) for n in ("query", "key", "value")], 1)
        out[p + "attn.c_attn.bias"] = np.concatenate([np.reshape(a[n]["bias"], -1) for n in ("query", "key", "value")])
        out[p + "attn.c_proj.weight"] = t.from_heads_out(a["out"]["kernel"])
        out[p + "attn.c_proj.bias"] = a["out"]["bias"]
        for hf, ours in (("ln_1", "attention_norm"), ("ln_2", "mlp_norm")):
            out[p + hf + ".weight"], out[p + hf + ".bias"] = b[ours]["scale"], b[ours]["bias"]
        for hf, ours in (("c_fc", "wi"), ("c_proj", "wo")):
            out[p + f"mlp.{hf}.weight"], out[p + f"mlp.{hf}.bias"] = b["mlp"][ours]["kernel"], b["mlp"][ours]["bias"]
    return out
