"""BERT (Hugging Face BertForMaskedLM; BertForPreTraining / BertModel weights too) <-> EncoderModel.

Shape: learned absolute positions, embedding LayerNorm, post-LN LayerNorm blocks (eps =
layer_norm_eps), exact-erf GELU, biases, the masked-LM head (transform dense + activation +
LayerNorm, decoder tied to the token table, output bias). Token types are not modelled: type 0 is
folded into the position table on import (so inputs of token type 0 — the default — give HF's
logits) and exported as zeros. Linear weights are (out, in): transposed. The pooler and the
next-sentence head of pre-training checkpoints are not imported.

  bert.embeddings.word_embeddings                         token_embedding/embedding
  bert.embeddings.position_embeddings + token_type[0]     encoder/position_embedding/embedding
  bert.embeddings.LayerNorm                               encoder/embedding_norm
  bert.encoder.layer.{i}.attention.self.{query,key,value} encoder/blocks/layers_{i}/attention/... (D, N, H)
  bert.encoder.layer.{i}.attention.output.dense           .../attention/out (N, H, D)
  bert.encoder.layer.{i}.attention.output.LayerNorm       .../attention_norm
  bert.encoder.layer.{i}.intermediate.dense / output.dense  .../mlp/wi, wo
  bert.encoder.layer.{i}.output.LayerNorm                 .../mlp_norm
  cls.predictions.transform.dense / LayerNorm             mlm_head/transform, transform_norm
  cls.predictions.bias                                    mlm_head/output_bias
"""
from __future__ import annotations

from typing import Any

import numpy as np

from transformer.interop import tensors as t
from transformer.interop.layouts import FULL_WIDTH, MULTI_HEAD
from transformer.spec import ConfigError, ModelConfig

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
EXPORT_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}
TYPE_VOCAB_SIZE = 2


def config_from_hf(c: dict[str, Any]) -> ModelConfig:
    act = c.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ConfigError(f"BERT hidden_act={act!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    kind = c.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise ConfigError(f"BERT position_embedding_type={kind!r} is not supported; only 'absolute'")
    if c.get("is_decoder") or c.get("add_cross_attention"):
        raise ConfigError("BERT as a decoder (is_decoder / add_cross_attention) is not supported")
    return ModelConfig(family="encoder", vocab_size=c["vocab_size"], d_model=c["hidden_size"],
                       num_layers=c["num_hidden_layers"], num_heads=c["num_attention_heads"],
                       d_ff=c["intermediate_size"], max_len=c["max_position_embeddings"], positional="learned",
                       activation=ACTIVATIONS[act], norm="layernorm", norm_position="post",
                       norm_eps=c.get("layer_norm_eps", 1e-12), tie_embeddings=True, use_bias=True,
                       embedding_norm=True)


NEEDS = dict(family="encoder", positional="learned", norm="layernorm", norm_position="post", embedding_norm=True,
             activation=tuple(EXPORT_ACTIVATIONS), tie_embeddings=True, use_bias=True, num_kv_heads=MULTI_HEAD,
             num_classes=0, head_dim=FULL_WIDTH, scale_embeddings=False, sliding_window=0, qk_norm=False,
             parallel_block=False, attention_scale=0.0)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    return dict(model_type="bert", architectures=["BertForMaskedLM"], vocab_size=cfg.vocab_size,
                hidden_size=cfg.d_model, num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                intermediate_size=cfg.d_ff, max_position_embeddings=cfg.max_len,
                hidden_act=EXPORT_ACTIVATIONS[cfg.activation], layer_norm_eps=cfg.norm_eps,
                type_vocab_size=TYPE_VOCAB_SIZE, position_embedding_type="absolute", tie_word_embeddings=True,
                pad_token_id=0)


def _dense(read: t.StateReader, name: str) -> dict[str, np.ndarray]:
    return {"kernel": t.linear_in_out(read(f"{name}.weight")), "bias": read(f"{name}.bias")}


def params_from_hf(state: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, Any]:
    read = t.StateReader(t.strip_prefix(state, "bert."), "BERT")
    N, H = cfg.num_heads, cfg.dim_per_head
    blocks = {}
    for i in range(cfg.num_layers):
        p = f"encoder.layer.{i}."
        attention = {}
        for name in ("query", "key", "value"):
            d = _dense(read, p + f"attention.self.{name}")
            attention[name] = {"kernel": t.to_heads_in(d["kernel"], N), "bias": d["bias"].reshape(N, H)}
        out = _dense(read, p + "attention.output.dense")
        attention["out"] = {"kernel": t.to_heads_out(out["kernel"], N), "bias": out["bias"]}
        blocks[f"layers_{i}"] = {
            "attention": attention, "attention_norm": read.layer_norm(p + "attention.output.LayerNorm"),
            "mlp": {"wi": _dense(read, p + "intermediate.dense"), "wo": _dense(read, p + "output.dense")},
            "mlp_norm": read.layer_norm(p + "output.LayerNorm")}
    positions = read("embeddings.position_embeddings.weight") + read("embeddings.token_type_embeddings.weight")[0]
    if "cls.predictions.bias" not in read.state:
        raise ConfigError("BERT checkpoint has no masked-LM head (cls.predictions.*); save a BertForMaskedLM "
                          "or BertForPreTraining model")
    params = {"token_embedding": {"embedding": read("embeddings.word_embeddings.weight")},
              "encoder": {"position_embedding": {"embedding": positions},
                          "embedding_norm": read.layer_norm("embeddings.LayerNorm"), "blocks": blocks},
              "mlm_head": {"transform": _dense(read, "cls.predictions.transform.dense"),
                           "transform_norm": read.layer_norm("cls.predictions.transform.LayerNorm"),
                           "output_bias": read("cls.predictions.bias")}}
    read.check_all_used(ignore=("cls.predictions.decoder.weight", "cls.predictions.decoder.bias", "position_ids",
                                "pooler.dense.weight", "pooler.dense.bias", "cls.seq_relationship.weight",
                                "cls.seq_relationship.bias"))
    return params


def params_to_hf(params: dict[str, Any], cfg: ModelConfig) -> dict[str, np.ndarray]:
    enc = params["encoder"]
    D = cfg.d_model
    out = {"bert.embeddings.word_embeddings.weight": params["token_embedding"]["embedding"],
           "bert.embeddings.position_embeddings.weight": enc["position_embedding"]["embedding"],
           "bert.embeddings.token_type_embeddings.weight": np.zeros((TYPE_VOCAB_SIZE, D), np.float32),
           "cls.predictions.bias": params["mlm_head"]["output_bias"]}

    def norm(name: str, p: dict[str, np.ndarray]) -> None:
        out[f"{name}.weight"], out[f"{name}.bias"] = p["scale"], p["bias"]

    def dense(name: str, kernel: np.ndarray, bias: np.ndarray) -> None:
        out[f"{name}.weight"], out[f"{name}.bias"] = t.linear_in_out(kernel), np.reshape(bias, -1)

    norm("bert.embeddings.LayerNorm", enc["embedding_norm"])
    for i in range(cfg.num_layers):
        b, p = enc["blocks"][f"layers_{i}"], f"bert.encoder.layer.{i}."
        for name in ("query", "key", "value"):
            a = b["attention"][name]
            dense(p + f"attention.self.{name}", t.from_heads_in(a["kernel"]), a["bias"])
        dense(p + "attention.output.dense", t.from_heads_out(b["attention"]["out"]["kernel"]),
              b["attention"]["out"]["bias"])
        norm(p + "attention.output.LayerNorm", b["attention_norm"])
        dense(p + "intermediate.dense", b["mlp"]["wi"]["kernel"], b["mlp"]["wi"]["bias"])
        dense(p + "output.dense", b["mlp"]["wo"]["kernel"], b["mlp"]["wo"]["bias"])
        norm(p + "output.LayerNorm", b["mlp_norm"])
    head = params["mlm_head"]
    dense("cls.predictions.transform.dense", head["transform"]["kernel"], head["transform"]["bias"])
    norm("cls.predictions.transform.LayerNorm", head["transform_norm"])
    return out
