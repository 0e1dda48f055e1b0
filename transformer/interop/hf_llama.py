"""LLaMA (Hugging Face LlamaForCausalLM / LlamaModel) <-> DecoderLM.

Shape: RoPE (rotate-half, as ours; theta from rope_parameters.rope_theta in transformers 5.x or
rope_theta in 4.x; only rope_type "default"), pre-LN RMSNorm (eps = rms_norm_eps), SwiGLU (silu;
"gelu" = our geglu), grouped-query attention (num_key_value_heads), head_dim from the config,
untied head unless tie_word_embeddings. Linear weights are (out, in): transposed. Qwen3 (hf_qwen3.py) is this
layout plus per-head QK-norm (model.qk_norm), which these functions map when cfg.qk_norm is set.

  model.embed_tokens                          token_embedding/embedding
  model.layers.{i}.input_layernorm            blocks/layers_{i}/attention_norm/scale
  model.layers.{i}.self_attn.{q,k,v}_proj     blocks/layers_{i}/attention/{query,key,value} (D, N|K, H)
  model.layers.{i}.self_attn.o_proj           blocks/layers_{i}/attention/out (N, H, D)
  model.layers.{i}.self_attn.{q,k}_norm       blocks/layers_{i}/attention/{query,key}_norm/scale (qk_norm: Qwen3)
  model.layers.{i}.post_attention_layernorm   blocks/layers_{i}/mlp_norm/scale
  model.layers.{i}.mlp.{gate,up,down}_proj    blocks/layers_{i}/mlp/{wi_gate,wi_up,wo}
  model.norm                                  final_norm/scale
  lm_head (V, D)                              head/kernel (D, V)   (untied only)
"""
from __future__ import annotations

from typing import Any

import numpy as np

from transformer.interop import tensors as t
from transformer.spec import ConfigError, ModelConfig

ACTIVATIONS = {"silu": "swiglu", "gelu": "geglu"}
EXPORT_ACTIVATIONS = {v: k for k, v in ACTIVATIONS.items()}


def _rope_theta(c: dict[str, Any]) -> float:
    rope = c.get("rope_parameters") or {}
    scaling = c.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type != "default":
        raise ConfigError(f"LLaMA rope_type={rope_type!r} is not supported; only 'default' RoPE is")
    return float(rope.get("rope_theta", c.get("rope_theta", 10000.0)))


def config_from_hf(c: dict[str, Any]) -> ModelConfig:
    act = c.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise ConfigError(f"LLaMA hidden_act={act!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    attention_bias, mlp_bias = bool(c.get("attention_bias", False)), bool(c.get("mlp_bias", False))
    if attention_bias != mlp_bias:
        raise ConfigError(f"LLaMA attention_bias={attention_bias} with mlp_bias={mlp_bias} is not supported; "
                          "this codebase has one use_bias for both")
    if c.get("pretraining_tp", 1) != 1:
        raise ConfigError(f"LLaMA pretraining_tp={c['pretraining_tp']} is not supported; only 1")
    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    return ModelConfig(family="decoder", vocab_size=c["vocab_size"], d_model=c["hidden_size"],
                       num_layers=c["num_hidden_layers"], num_heads=heads,
                       num_kv_heads=c.get("num_key_value_heads") or heads,
                       head_dim=0 if head_dim * heads == c["hidden_size"] else head_dim,
                       d_ff=c["intermediate_size"], max_len=c.get("max_position_embeddings", 2048), positional="rope",
                       rope_base=_rope_theta(c), activation=ACTIVATIONS[act], norm="rmsnorm", norm_position="pre",
                       norm_eps=c.get("rms_norm_eps", 1e-6), tie_embeddings=bool(c.get("tie_word_embeddings", False)),
                       use_bias=attention_bias)


# The LLaMA-shaped decoder (this and Qwen3 share it): RoPE, pre-LN RMSNorm, gated FFN, sequential blocks.
LAYOUT = dict(family="decoder", positional="rope", norm="rmsnorm", norm_position="pre",
              activation=tuple(EXPORT_ACTIVATIONS), parallel_block=False, embedding_norm=False,
              scale_embeddings=False, sliding_window=0, attention_scale=0.0)
NEEDS = dict(LAYOUT, qk_norm=False)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    return dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=cfg.vocab_size,
                hidden_size=cfg.d_model, num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                num_key_value_heads=cfg.kv_heads, head_dim=cfg.dim_per_head, intermediate_size=cfg.d_ff,
                max_position_embeddings=cfg.max_len, hidden_act=EXPORT_ACTIVATIONS[cfg.activation],
                rms_norm_eps=cfg.norm_eps, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base},
                tie_word_embeddings=cfg.tie_embeddings, attention_bias=cfg.use_bias, mlp_bias=cfg.use_bias,
                bos_token_id=min(1, cfg.vocab_size - 1), eos_token_id=min(2, cfg.vocab_size - 1))


def params_from_hf(state: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, Any]:
    read = t.StateReader(t.strip_prefix(state, "model."), "LLaMA")
    N, K, H = cfg.num_heads, cfg.kv_heads, cfg.dim_per_head

    def linear(name: str, heads: int = 0, out: bool = False) -> dict[str, np.ndarray]:
        kernel = t.linear_in_out(read(f"{name}.weight"))
        if heads:
            kernel = t.to_heads_out(kernel, heads) if out else t.to_heads_in(kernel, heads)
        p = {"kernel": kernel}
        if cfg.use_bias:
            bias = read(f"{name}.bias")
            p["bias"] = bias if out or not heads else bias.reshape(heads, H)
        return p

    blocks = {}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        attention = {"query": linear(p + "self_attn.q_proj", N), "key": linear(p + "self_attn.k_proj", K),
                     "value": linear(p + "self_attn.v_proj", K), "out": linear(p + "self_attn.o_proj", N, out=True)}
        if cfg.qk_norm:
            attention["query_norm"] = {"scale": read(p + "self_attn.q_norm.weight")}
            attention["key_norm"] = {"scale": read(p + "self_attn.k_norm.weight")}
        blocks[f"layers_{i}"] = {
            "attention_norm": {"scale": read(p + "input_layernorm.weight")}, "attention": attention,
            "mlp_norm": {"scale": read(p + "post_attention_layernorm.weight")},
            "mlp": {"wi_gate": linear(p + "mlp.gate_proj"), "wi_up": linear(p + "mlp.up_proj"),
                    "wo": linear(p + "mlp.down_proj")}}
    params = {"token_embedding": {"embedding": read("embed_tokens.weight")}, "blocks": blocks,
              "final_norm": {"scale": read("norm.weight")}}
    if not cfg.tie_embeddings:
        params["head"] = {"kernel": t.linear_in_out(read("lm_head.weight"))}
    read.check_all_used(ignore=("lm_head.weight", "rotary_emb.inv_freq"))
    return params


def params_to_hf(params: dict[str, Any], cfg: ModelConfig) -> dict[str, np.ndarray]:
    out = {"model.embed_tokens.weight": params["token_embedding"]["embedding"],
           "model.norm.weight": params["final_norm"]["scale"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = t.linear_in_out(params["head"]["kernel"])

    def put(name: str, p: dict[str, np.ndarray], kind: str = "") -> None:
        kernel = p["kernel"]
        kernel = t.from_heads_in(kernel) if kind == "in" else t.from_heads_out(kernel) if kind == "out" else kernel
        out[f"{name}.weight"] = t.linear_in_out(kernel)
        if "bias" in p:
            out[f"{name}.bias"] = np.reshape(p["bias"], -1)

    for i in range(cfg.num_layers):
        b, p = params["blocks"][f"layers_{i}"], f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = b["attention_norm"]["scale"]
        out[p + "post_attention_layernorm.weight"] = b["mlp_norm"]["scale"]
        for hf, ours in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
            put(p + f"self_attn.{hf}", b["attention"][ours], "in")
        put(p + "self_attn.o_proj", b["attention"]["out"], "out")
        if cfg.qk_norm:
            out[p + "self_attn.q_norm.weight"] = b["attention"]["query_norm"]["scale"]
            out[p + "self_attn.k_norm.weight"] = b["attention"]["key_norm"]["scale"]
        for hf, ours in (("gate_proj", "wi_gate"), ("up_proj", "wi_up"), ("down_proj", "wo")):
            put(p + f"mlp.{hf}", b["mlp"][ours])
    return out
