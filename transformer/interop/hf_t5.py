"""T5 (Hugging Face T5ForConditionalGeneration) <-> EncoderDecoderModel.

Shape: T5's relative position bias (positional=t5_relative; relative_attention_num_buckets and _max_distance),
pre-LN RMSNorm without mean or bias ("T5LayerNorm", eps = layer_norm_epsilon), no biases, no 1/sqrt(d)
scaling of q·k (T5 folds it into the initialisation: attention_scale=1.0), heads of d_kv (head_dim), one
token table for both stacks. Two shapes of head:
  v1.0 ("relu", tie_word_embeddings absent or true): the head is the token table, applied to hidden × d_model^-0.5
       (scale_tied_head=True);
  v1.1 ("gated-gelu", tie_word_embeddings false): its own lm_head, no rescale (tie_embeddings=False).
(transformers 5.x keeps the rescale switch as scale_decoder_outputs and ties lm_head to the table
unless a checkpoint holds a different lm_head.weight; this converter reads it the same way.) Feed-forward:
feed_forward_proj "relu" | "gelu" | "gelu_new" | "gated-gelu" (T5 v1.1: the tanh GELU, our
gelu_tanh_glu) | "gated-silu" (swiglu) | "gated-gelu_python" (exact, our geglu). Linear weights are
(out, in): transposed. The decoder starts from the pad token (id 0) in T5; pass decoder inputs that begin
with it (transformer.inference.generate.generate_seq2seq(..., decoder_start_id=0)).

  shared                                                  token_embedding/embedding
  encoder.block.0.layer.0.SelfAttention.relative_attention_bias (R, N)
                                                          encoder/relative_position_bias/embedding (R, N)
  encoder.block.{i}.layer.0.layer_norm                    encoder/blocks/layers_{i}/attention_norm/scale
  encoder.block.{i}.layer.0.SelfAttention.{q,k,v}         .../attention/{query,key,value}/kernel (D, N, H)
  encoder.block.{i}.layer.0.SelfAttention.o               .../attention/out/kernel (N, H, D)
  encoder.block.{i}.layer.1.layer_norm                    .../mlp_norm/scale
  encoder.block.{i}.layer.1.DenseReluDense.{wi | wi_0, wi_1, wo}   .../mlp/{wi | wi_gate, wi_up, wo}
  encoder.final_layer_norm                                encoder/final_norm/scale
  decoder.block.0.layer.0.SelfAttention.relative_attention_bias   decoder/relative_position_bias/embedding
  decoder.block.{i}.layer.0 (self-attention) / layer.1 (EncDecAttention) / layer.2 (feed-forward)
                                                          decoder/blocks/layers_{i}/attention / cross_attention / mlp
  decoder.final_layer_norm                                decoder/final_norm/scale
  lm_head (V, D)                                          head/kernel (D, V)   (untied only)

Export folds a scale other than T5's (our presets keep 1/sqrt(H)) into the query kernels, so any
attention_scale exports; importing gives attention_scale=1.0 and the scaled kernels (the same logits).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from transformer.interop import tensors as t
from transformer.interop.layouts import MULTI_HEAD
from transformer.spec import ConfigError, ModelConfig

# (dense_act_fn, gated) -> our activation, the way T5Config parses feed_forward_proj
ACTIVATIONS = {("relu", False): "relu", ("gelu", False): "gelu", ("gelu_python", False): "gelu",
               ("gelu_new", False): "gelu_tanh", ("gelu_pytorch_tanh", False): "gelu_tanh",
               ("gelu_new", True): "gelu_tanh_glu", ("gelu_pytorch_tanh", True): "gelu_tanh_glu",
               ("gelu", True): "geglu", ("gelu_python", True): "geglu", ("silu", True): "swiglu",
               ("swish", True): "swiglu"}
EXPORT_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "gelu_tanh_glu": "gated-gelu",
                      "geglu": "gated-gelu_python", "swiglu": "gated-silu"}
IGNORED = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight",  # copies of shared (tied)
           "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight")  # unused, as HF ignores it


def _activation(c: dict[str, Any]) -> str:
    proj = c.get("feed_forward_proj", "relu")
    parts = proj.split("-")
    gated = len(parts) == 2 and parts[0] == "gated"
    if len(parts) > 2 or (len(parts) == 2 and not gated):
        raise ConfigError(f"T5 feed_forward_proj={proj!r} is not valid (expected 'ACT' or 'gated-ACT')")
    act = "gelu_new" if proj == "gated-gelu" else parts[-1]  # as T5Config: "gated-gelu" is the tanh GELU
    if (act, gated) not in ACTIVATIONS:
        raise ConfigError(f"T5 feed_forward_proj={proj!r} is not supported; supported: relu, gelu, gelu_new, "
                          "gated-gelu, gated-gelu_python, gated-silu")
    return ACTIVATIONS[act, gated]


def _untied_head(state: dict[str, np.ndarray]) -> bool:
    """A separate lm_head: present in the checkpoint and different from the token table (transformers 5.x's
    rule; v1.1 checkpoints hold one, v1.0 and tied exports none or an equal copy)."""
    return "lm_head.weight" in state and not np.array_equal(state["lm_head.weight"], state.get("shared.weight"))


def config_from_hf(c: dict[str, Any], state: dict[str, np.ndarray] | None = None) -> ModelConfig:
    """The config of a T5 checkpoint; `state` (its tensors) decides whether lm_head is its own (without it:
    untied exactly when tie_word_embeddings is false, as transformers 4.x reads it)."""
    if c.get("is_encoder_decoder") is False or c.get("is_decoder"):
        raise ConfigError("T5 as a decoder only (is_decoder / is_encoder_decoder=False) is not supported; "
                          "T5ForConditionalGeneration checkpoints are")
    tie_flag = c.get("tie_word_embeddings", True) is not False
    scale = bool(c["scale_decoder_outputs"]) if "scale_decoder_outputs" in c else tie_flag
    tied = (not _untied_head(state)) if state is not None else tie_flag
    if scale and not tied:
        raise ConfigError("T5 with a separate lm_head and the d_model^-0.5 output rescale (tie_word_embeddings / "
                          "scale_decoder_outputs true) is not supported: the rescale belongs to the tied head")
    heads, d_kv, d = c["num_heads"], c["d_kv"], c["d_model"]
    return ModelConfig(family="encoder_decoder", vocab_size=c["vocab_size"], d_model=d,
                       num_layers=c.get("num_decoder_layers") or c["num_layers"], num_encoder_layers=c["num_layers"],
                       num_heads=heads, head_dim=0 if heads * d_kv == d else d_kv, d_ff=c["d_ff"],
                       max_len=c.get("n_positions", 512), positional="t5_relative",
                       relative_num_buckets=c.get("relative_attention_num_buckets", 32),
                       relative_max_distance=c.get("relative_attention_max_distance", 128),
                       activation=_activation(c), norm="rmsnorm", norm_position="pre",
                       norm_eps=c.get("layer_norm_epsilon", 1e-6), tie_embeddings=tied, use_bias=False,
                       attention_scale=1.0, scale_tied_head=scale)


NEEDS = dict(family="encoder_decoder", positional="t5_relative", norm="rmsnorm", norm_position="pre",
             activation=tuple(EXPORT_ACTIVATIONS), use_bias=False, num_kv_heads=MULTI_HEAD, embedding_norm=False,
             scale_embeddings=False, sliding_window=0, qk_norm=False, parallel_block=False)


def config_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    return dict(model_type="t5", architectures=["T5ForConditionalGeneration"], vocab_size=cfg.vocab_size,
                d_model=cfg.d_model, d_kv=cfg.dim_per_head, d_ff=cfg.d_ff, num_layers=cfg.encoder_layers,
                num_decoder_layers=cfg.num_layers, num_heads=cfg.num_heads,
                relative_attention_num_buckets=cfg.relative_num_buckets,
                relative_attention_max_distance=cfg.relative_max_distance, dropout_rate=cfg.dropout_rate,
                layer_norm_epsilon=cfg.norm_eps, feed_forward_proj=EXPORT_ACTIVATIONS[cfg.activation],
                is_encoder_decoder=True, tie_word_embeddings=cfg.scale_tied_head,
                scale_decoder_outputs=cfg.scale_tied_head, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)


def _mlp_names(cfg: ModelConfig) -> tuple[tuple[str, str], ...]:
    """(Hugging Face name, ours) of the feed-forward kernels."""
    return (("wi_0", "wi_gate"), ("wi_1", "wi_up"), ("wo", "wo")) if cfg.gated else (("wi", "wi"), ("wo", "wo"))


def _query_scale(cfg: ModelConfig) -> float:
    """What export multiplies the query kernels by, so that T5's unscaled q·k gives our logits."""
    return cfg.attention_scale or cfg.dim_per_head ** -0.5


def params_from_hf(state: dict[str, np.ndarray], cfg: ModelConfig) -> dict[str, Any]:
    read = t.StateReader(state, "T5")
    N = cfg.num_heads

    def attention(prefix: str) -> dict[str, Any]:
        p = {ours: {"kernel": t.to_heads_in(t.linear_in_out(read(f"{prefix}.{hf}.weight")), N)}
             for hf, ours in (("q", "query"), ("k", "key"), ("v", "value"))}
        p["out"] = {"kernel": t.to_heads_out(t.linear_in_out(read(f"{prefix}.o.weight")), N)}
        return p

    def mlp(prefix: str) -> dict[str, Any]:
        return {ours: {"kernel": t.linear_in_out(read(f"{prefix}.DenseReluDense.{hf}.weight"))}
                for hf, ours in _mlp_names(cfg)}

    def norm(name: str) -> dict[str, np.ndarray]:
        return {"scale": read(f"{name}.weight")}

    def stack(name: str, layers: int, cross: bool) -> dict[str, Any]:
        blocks = {}
        for i in range(layers):
            p = f"{name}.block.{i}.layer."
            b = {"attention_norm": norm(p + "0.layer_norm"), "attention": attention(p + "0.SelfAttention")}
            if cross:
                b["cross_attention_norm"] = norm(p + "1.layer_norm")
                b["cross_attention"] = attention(p + "1.EncDecAttention")
            f = "2" if cross else "1"
            b["mlp_norm"], b["mlp"] = norm(p + f + ".layer_norm"), mlp(p + f)
            blocks[f"layers_{i}"] = b
        table = read(f"{name}.block.0.layer.0.SelfAttention.relative_attention_bias.weight")
        return {"relative_position_bias": {"embedding": table}, "blocks": blocks,
                "final_norm": norm(f"{name}.final_layer_norm")}

    params = {"token_embedding": {"embedding": read("shared.weight")},
              "encoder": stack("encoder", cfg.encoder_layers, cross=False),
              "decoder": stack("decoder", cfg.num_layers, cross=True)}
    if not cfg.tie_embeddings:
        params["head"] = {"kernel": t.linear_in_out(read("lm_head.weight"))}
    read.check_all_used(ignore=IGNORED + ("lm_head.weight",))
    return params


def params_to_hf(params: dict[str, Any], cfg: ModelConfig) -> dict[str, np.ndarray]:
    out = {"shared.weight": params["token_embedding"]["embedding"]}
    # The head: the table itself when tied (written as lm_head too, equal, so that transformers ties it
    # whatever the config says), else its own kernel.
    out["lm_head.weight"] = (params["token_embedding"]["embedding"] if cfg.tie_embeddings
                             else t.linear_in_out(params["head"]["kernel"]))
    q_scale = np.float32(_query_scale(cfg))

    def attention(prefix: str, p: dict[str, Any]) -> None:
        for hf, ours in (("q", "query"), ("k", "key"), ("v", "value")):
            kernel = t.from_heads_in(p[ours]["kernel"])
            out[f"{prefix}.{hf}.weight"] = t.linear_in_out(kernel * q_scale if hf == "q" and q_scale != 1 else kernel)
        out[f"{prefix}.o.weight"] = t.linear_in_out(t.from_heads_out(p["out"]["kernel"]))

    def stack(name: str, layers: int, cross: bool) -> None:
        s = params[name]
        out[f"{name}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = \
            s["relative_position_bias"]["embedding"]
        out[f"{name}.final_layer_norm.weight"] = s["final_norm"]["scale"]
        for i in range(layers):
            b, p = s["blocks"][f"layers_{i}"], f"{name}.block.{i}.layer."
            out[p + "0.layer_norm.weight"] = b["attention_norm"]["scale"]
            attention(p + "0.SelfAttention", b["attention"])
            if cross:
                out[p + "1.layer_norm.weight"] = b["cross_attention_norm"]["scale"]
                attention(p + "1.EncDecAttention", b["cross_attention"])
            f = "2" if cross else "1"
            out[p + f + ".layer_norm.weight"] = b["mlp_norm"]["scale"]
            for hf, ours in _mlp_names(cfg):
                out[p + f"{f}.DenseReluDense.{hf}.weight"] = t.linear_in_out(b["mlp"][ours]["kernel"])

    stack("encoder", cfg.encoder_layers, cross=False)
    stack("decoder", cfg.num_layers, cross=True)
    return out
