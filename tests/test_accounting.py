"""Analytic parameter and FLOP counts against the real Flax models and known figures."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.lm import PRESETS
from transformer.spec import ModelConfig
from transformer.models.decoder import DecoderLM
from transformer.spec import flops_per_token, matmul_params, param_counts, train_flops

SMALL = dict(vocab_size=61, d_model=32, num_layers=3, num_heads=4, d_ff=48, max_len=40)


def _real_params(cfg: ModelConfig) -> dict:
    shapes = jax.eval_shape(DecoderLM(cfg).init, jax.random.PRNGKey(0), jnp.ones((1, 4), jnp.int32))
    return nn.unbox(shapes["params"])


def _size(tree) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree)))


VARIANTS = {
    "gpt2_tiny": ModelConfig(**PRESETS["gpt2_tiny"], vocab_size=259),
    "llama_tiny": ModelConfig(**PRESETS["llama_tiny"], vocab_size=259),
    "gpt2_untied_nobias": ModelConfig(**SMALL, tie_embeddings=False, use_bias=False),
    "llama_tied_bias_mqa": ModelConfig(**SMALL, positional="rope", norm="rmsnorm", activation="swiglu",
                                       num_kv_heads=1, use_bias=True),
    "gqa_head_dim": ModelConfig(**SMALL, num_kv_heads=2, head_dim=12, positional="sinusoidal"),
    "post_ln_embnorm_geglu": ModelConfig(**SMALL, norm_position="post", embedding_norm=True, activation="geglu",
                                         positional="none"),
    "scanned": ModelConfig(**SMALL, scan_layers=True, activation="gelu_tanh"),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_param_counts_equal_real_model(name):
    cfg = VARIANTS[name]
    params = _real_params(cfg)
    counts = param_counts(cfg)
    assert counts["total"] == _size(params)
    embedding = _size(params["token_embedding"]) + _size(params.get("position_embedding", {}))
    assert counts["embedding"] == embedding
    assert counts["non_embedding"] == counts["total"] - embedding
    # N_matmul: every kernel (attention, FFN, untied head) plus V·D for a tied head.
    kernels = sum(int(np.prod(x.shape)) for path, x in jax.tree_util.tree_leaves_with_path(params)
                  if path[-1].key == "kernel")
    tied_head = cfg.vocab_size * cfg.d_model if cfg.tie_embeddings else 0
    assert matmul_params(cfg) == kernels + tied_head


def test_gpt2_small_matches_published_count():
    cfg = ModelConfig(**PRESETS["gpt2_small"], vocab_size=50257)
    counts = param_counts(cfg)
    assert counts["total"] == 124_439_808  # Hugging Face gpt2
    assert counts["embedding"] == 50257 * 768 + 1024 * 768
    per_token = flops_per_token(cfg, 1024)
    assert per_token["six_n"] == 6 * (12 * 12 * 768 * 768 + 50257 * 768)
    assert per_token["with_attention"] - per_token["six_n"] == 12 * 12 * 1024 * 768
    assert train_flops(cfg, 1024, 1e6) == pytest.approx(1e6 * per_token["with_attention"])
    assert train_flops(cfg, 1024, 1e6, include_attention=False) == pytest.approx(1e6 * per_token["six_n"])


def test_encoder_decoder_and_encoder_counts_by_hand():
    D, F, V, N, C = 16, 40, 30, 2, 3
    base = dict(vocab_size=V, d_model=D, num_heads=N, d_ff=F, max_len=8, positional="sinusoidal",
                norm="rmsnorm", activation="relu", use_bias=False, tie_embeddings=True)
    attn, ffn, norm = 4 * D * D, 2 * D * F, D
    enc_dec = ModelConfig(family="encoder_decoder", num_layers=2, num_encoder_layers=3, **base)
    counts = param_counts(enc_dec)
    expected = V * D + 3 * (attn + ffn + 2 * norm) + norm + 2 * (2 * attn + ffn + 3 * norm) + norm
    assert counts == {"total": expected, "non_embedding": expected - V * D, "embedding": V * D,
                      "trainable": expected}  # no LoRA: every parameter trains
    assert matmul_params(enc_dec) == 3 * (attn + ffn) + 2 * (2 * attn + ffn) + V * D
    per_token = flops_per_token(enc_dec, 10)
    assert per_token["with_attention"] - per_token["six_n"] == 12 * (3 + 2 * 2) * 10 * D
    encoder = ModelConfig(family="encoder", num_layers=2, num_classes=C, **dict(base, use_bias=True,
                                                                                norm="layernorm"))
    attn_b, ffn_b = attn + 4 * D, ffn + F + D
    pooler = D * D + D  # BERT's pooler (dense + tanh on the first token) before the classifier
    expected = V * D + 2 * (attn_b + ffn_b + 2 * 2 * D) + 2 * D + pooler + D * C + C
    assert param_counts(encoder)["total"] == expected


def test_causal_half_counts_only_causal_self_attention_at_half():
    """with_attention counts the full T² (the loop's flops, the bench's mfu); with_attention_causal_half (the
    bench's mfu_causal_half, MaxText's count) halves the causal self-attention layers and nothing else."""
    gpt2 = ModelConfig(**PRESETS["gpt2_small"], vocab_size=50257)
    per_token = flops_per_token(gpt2, 1024)
    full = 12 * 12 * 1024 * 768
    assert per_token["with_attention"] - per_token["six_n"] == full
    assert per_token["with_attention_causal_half"] - per_token["six_n"] == full / 2
    D, N = 16, 2
    base = dict(vocab_size=30, d_model=D, num_heads=N, d_ff=40, max_len=8, positional="sinusoidal")
    enc_dec = flops_per_token(ModelConfig(family="encoder_decoder", num_layers=2, num_encoder_layers=3, **base), 10)
    # encoder self (3) and cross (2) whole, the decoder's causal self-attention (2) at half
    assert enc_dec["with_attention_causal_half"] - enc_dec["six_n"] == 12 * (3 + 2 + 2 / 2) * 10 * D
    encoder = flops_per_token(ModelConfig(family="encoder", num_layers=2, **base), 10)
    assert encoder["with_attention_causal_half"] == encoder["with_attention"]  # bidirectional: nothing halved


def test_flops_reject_bad_seq_len():
    with pytest.raises(ValueError, match="seq_len"):
        flops_per_token(VARIANTS["gpt2_tiny"], 0)
