"""GPT-NeoX (Hugging Face GPTNeoXForCausalLM, use_parallel_residual=True) <-> DecoderLM with parallel_block.

Shape: RoPE over the whole head (partial_rotary_factor 1.0; rotate-half, as ours), pre-LN LayerNorm with biases,
a plain FFN (gelu / gelu_new / relu) with biases, attention with biases, multi-head, untied head (or tied when
tie_word_embeddings). NeoX's parallel residual is x + attn(ln1(x)) + mlp(ln2(x)) with TWO norms; our
parallel_block reads ONE norm, so export writes it as both, and import requires the two to be equal. The fused
query_key_value (3D, D) holds, per head n, rows [q_n; k_n; v_n] of H each (the output viewed as (N, 3H)).

  gpt_neox.embed_in                              token_embedding/embedding
  gpt_neox.layers.{i}.input_layernorm            blocks/layers_{i}/norm  (and post_attention_layernorm, equal)
  gpt_neox.layers.{i}.attention.query_key_value  blocks/layers_{i}/attention/{query,key,value} (D, N, H)
  gpt_neox.layers.{i}.attention.dense            blocks/layers_{i}/attention/out (N, H, D)
  gpt_neox.layers.{i}.mlp.dense_h_to_4h / 4h_to_h  blocks/layers_{i}/mlp/wi, wo
  gpt_neox.final_layer_norm                      final_norm
  embed_out (lm_head in transformers 5.x) (V, D)  head/kernel (D, V)   (untied only)
"""
from __future__ import annotations

from typing import Any

import numpy as np

from transformer.interop import tensors as t
from transformer.interop.layouts import FULL_WIDTH, MULTI_HEAD
from transformer.spec import ConfigError, ModelConfig

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
EXPORT_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}


def _rope(c: dict[str, Any]) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) from transformers 5.x's rope_parameters or 4.x's keys."""
    rope = c.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default" or c.get("rope_scaling"):
        raise ConfigError("GPT-NeoX rope scaling is not supported; only 'default' RoPE is")
    return (float(rope.get("rope_theta", c.get("rotary_emb_base", 10000.0))),
            float(rope.get("partial_rotary_factor", c.get("rotary_pct", 0.25))))


def config_from_hf(c: dict[str, Any]) -> ModelConfig:
    if not c.get("use_parallel_residual", True):
        raise ConfigError("GPT-NeoX use_parallel_residual=False is not supported; only the parallel block "
                          "(model.parallel_block=True) is")
    theta, partial = _rope(c)
    if partial != 1.0:
        raise ConfigError(f"GPT-NeoX partial_rotary_factor (rotary_pct)={partial} is not supported: model.positional="
                          "'rope' rotates the whole head (1.0)")
    if not c.get("attention_bias", True):
        raise ConfigError("GPT-NeoX attention_bias=False is not supported: its feed-forward layer and norms have "
                          "biases, and this codebase has one use_bias for all")
    act = c.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ConfigError(f"GPT-NeoX hidden_act={act!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    return ModelConfig(family="decoder", vocab_size=c["vocab_size"], d_model=c["hidden_size"],
                       num_layers=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
                       d_ff=c["intermediate_size"], max_len=c.get("max_position_embeddings", 2048), positional="rope",
                       rope_base=theta, activation=ACTIVATIONS[act], norm="layernorm", norm_position="pre",
                       norm_eps=c.get("layer_norm_eps", 1e-5), tie_embeddings=bool(c.get("tie_word_embeddings", False)),
                       use_bias=True, parallel_block=True)


NEEDS = dict(family="decoder", parallel_block=True, positional="rope", norm="layernorm", use_bias=True,
             activation=tuple(EXPORT_ACTIVATIONS), num_kv_heads=MULTI_HEAD, head_dim=FULL_WIDTH, qk_norm=False,
             embedding_norm=False, scale_embeddings=False, sliding_window=0, attention_scale=0.0)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    return dict(model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"], vocab_size=cfg.vocab_size,
                hidden_size=cfg.d_model, num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                intermediate_size=cfg.d_ff, hidden_act=EXPORT_ACTIVATIONS[cfg.activation],
                max_position_embeddings=cfg.max_len, layer_norm_eps=cfg.norm_eps, use_parallel_residual=True,
                attention_bias=True, rotary_pct=1.0, rotary_emb_base=cfg.rope_base,
                rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_base, "partial_rotary_factor": 1.0},
                tie_word_embeddings=cfg.tie_embeddings, bos_token_id=min(1, cfg.vocab_size - 1),
                eos_token_id=min(2, cfg.vocab_size - 1))


def params_from_hf(state: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, Any]:
    read = t.StateReader(t.strip_prefix(state, "gpt_neox."), "GPT-NeoX")
    N, D = cfg.num_heads, cfg.d_model
    H = D // N

    def dense(name: str) -> dict[str, np.ndarray]:
        return {"kernel": t.linear_in_out(read(f"{name}.weight")), "bias": read(f"{name}.bias")}

    blocks = {}
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        norm, norm2 = read.layer_norm(p + "input_layernorm"), read.layer_norm(p + "post_attention_layernorm")
        if any(not np.array_equal(norm[k], norm2[k]) for k in norm):
            raise ConfigError(f"GPT-NeoX layer {i}: input_layernorm and post_attention_layernorm differ; "
                              "model.parallel_block reads one norm for attention and feed-forward, so only "
                              "checkpoints where they are equal can be imported")
        qkv_w = read(p + "attention.query_key_value.weight").reshape(N, 3, H, D)   # (3D, D) rows per head
        qkv_b = read(p + "attention.query_key_value.bias").reshape(N, 3, H)
        attention = {name: {"kernel": np.ascontiguousarray(qkv_w[:, j].transpose(2, 0, 1)), "bias": qkv_b[:, j]}
                     for j, name in enumerate(("query", "key", "value"))}
        out = dense(p + "attention.dense")
        attention["out"] = {"kernel": t.to_heads_out(out["kernel"], N), "bias": out["bias"]}
        blocks[f"layers_{i}"] = {"norm": norm, "attention": attention,
                                 "mlp": {"wi": dense(p + "mlp.dense_h_to_4h"), "wo": dense(p + "mlp.dense_4h_to_h")}}
    params = {"token_embedding": {"embedding": read("embed_in.weight")}, "blocks": blocks,
              "final_norm": read.layer_norm("final_layer_norm")}
    head = "lm_head.weight" if "lm_head.weight" in state else "embed_out.weight"
    if not cfg.tie_embeddings:
        params["head"] = {"kernel": t.linear_in_out(read(head))}
    read.check_all_used(ignore=("lm_head.weight", "embed_out.weight", "rotary_emb.inv_freq", "attention.bias",
                                "attention.masked_bias"))
    return params


def params_to_hf(params: dict[str, Any], cfg: ModelConfig) -> dict[str, np.ndarray]:
    final = params["final_norm"]
    out = {"gpt_neox.embed_in.weight": params["token_embedding"]["embedding"],
           "gpt_neox.final_layer_norm.weight": final["scale"], "gpt_neox.final_layer_norm.bias": final["bias"]}
    if not cfg.tie_embeddings:
        out["embed_out.weight"] = t.linear_in_out(params["head"]["kernel"])
    for i in range(cfg.num_layers):
        b, p = params["blocks"][f"layers_{i}"], f"gpt_neox.layers.{i}."
        for hf in ("input_layernorm", "post_attention_layernorm"):   # our one norm, written as NeoX's two
            out[p + hf + ".weight"], out[p + hf + ".bias"] = b["norm"]["scale"], b["norm"]["bias"]
        a = b["attention"]
        w_DN3H = np.stack([a[n]["kernel"] for n in ("query", "key", "value")], axis=2)   # (D, N, 3, H)
        out[p + "attention.query_key_value.weight"] = t.linear_in_out(w_DN3H.reshape(w_DN3H.shape[0], -1))
        out[p + "attention.query_key_value.bias"] = np.stack([a[n]["bias"] for n in ("query", "key", "value")],
                                                             axis=1).reshape(-1)
        out[p + "attention.dense.weight"] = t.linear_in_out(t.from_heads_out(a["out"]["kernel"]))
        out[p + "attention.dense.bias"] = a["out"]["bias"]
        for hf, ours in (("dense_h_to_4h", "wi"), ("dense_4h_to_h", "wo")):
            out[p + f"mlp.{hf}.weight"] = t.linear_in_out(b["mlp"][ours]["kernel"])
            out[p + f"mlp.{hf}.bias"] = b["mlp"][ours]["bias"]
    return out
