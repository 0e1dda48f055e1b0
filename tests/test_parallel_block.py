"""model.parallel_block: x + attention(norm(x)) + ffn(norm(x)) from ONE norm (GPT-J, PaLM).

The block against its formula, the settings it refuses, the generic causality / packing / decoding-cache tests
with it on, and Hugging Face GPT-NeoX (use_parallel_residual=True, its two norms equal): logits within 1e-4 of
`transformers`, export loaded back by `transformers`, re-import exact."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import test_decoder as generic_decoder
from cheap_init import init_variables
from transformer.layers.attention import MultiHeadAttention
from transformer.layers.feedforward import FeedForward
from transformer.models.blocks import TransformerBlock
from transformer.models.encoder import EncoderModel
from transformer.spec import ConfigError, ModelConfig

GPT2_PAR = generic_decoder.GPT2.replace(parallel_block=True, num_layers=1)
LLAMA_PAR = generic_decoder.LLAMA.replace(parallel_block=True, num_layers=1)


def test_block_is_x_plus_attention_plus_ffn_of_one_layernorm():
    cfg = ModelConfig(d_model=16, num_heads=2, d_ff=24, positional="none", parallel_block=True, norm_eps=1e-5)
    x_BTD = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 16))
    block = TransformerBlock(cfg, causal=True)
    params = init_variables(block, x_BTD, seed=1)["params"]
    rng = np.random.RandomState(0)
    params = jax.tree.map(lambda p: np.asarray(p) + rng.normal(0, 0.3, np.shape(p)), params)   # scale, bias ≠ 1, 0
    assert set(params) == {"norm", "attention", "mlp"}                 # one norm, no attention_norm / mlp_norm
    x = np.asarray(x_BTD)
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    h = (x - mean) / np.sqrt(var + 1e-5) * params["norm"]["scale"] + params["norm"]["bias"]
    attn = MultiHeadAttention(cfg, causal=True).apply({"params": params["attention"]}, jnp.asarray(h))
    ffn = FeedForward(cfg).apply({"params": params["mlp"]}, jnp.asarray(h))
    np.testing.assert_allclose(block.apply({"params": params}, x_BTD), x + attn + ffn, atol=1e-5)


def test_refused_settings_are_named():
    with pytest.raises(ConfigError, match="parallel_block.*norm_position='pre'"):
        ModelConfig(parallel_block=True, norm_position="post")
    with pytest.raises(ConfigError, match="parallel_block.*encoder_decoder"):
        ModelConfig(parallel_block=True, family="encoder_decoder")
    with pytest.raises(ConfigError, match="model.parallel_block=1 must be True or False"):
        ModelConfig(parallel_block=1)


@pytest.mark.slow
def test_decoder_causal_packed_and_cached():
    generic_decoder.test_causal(GPT2_PAR, "chunked")
    generic_decoder.test_packed_segments_do_not_leak(LLAMA_PAR, "einsum")
    generic_decoder.test_kv_cache_decoding_matches_full_forward(LLAMA_PAR.replace(scan_layers=True))


def test_encoder_bidirectional_and_segments_apart():
    cfg = ModelConfig(family="encoder", vocab_size=61, d_model=32, num_heads=2, num_layers=1, d_ff=48,
                      parallel_block=True)
    model = EncoderModel(cfg)
    tokens = jnp.asarray(np.random.RandomState(0).randint(3, 61, (1, 10)), jnp.int32)
    seg = jnp.asarray([[1] * 4 + [2] * 4 + [0] * 2])
    params = init_variables(model, tokens)
    apply = jax.jit(model.apply)  # one compilation for both inputs
    base, changed = (apply(params, t, None, seg) for t in (tokens, tokens.at[0, 6].set(3).at[0, 9].set(3)))
    np.testing.assert_array_equal(base[0, :4], changed[0, :4])
    assert np.abs(np.asarray(changed[0, 4:6] - base[0, 4:6])).max() > 1e-6


# ---- Hugging Face GPT-NeoX

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from hf_checks import assert_round_trip, perturbed  # noqa: E402
from transformer.interop.hf import from_pretrained  # noqa: E402

V, TOL = 101, 1e-4


def _neox(equal_norms: bool = True, **overrides):
    kwargs = dict(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                  rotary_pct=1.0, rotary_emb_base=500.0, use_parallel_residual=True, hidden_act="gelu",
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = perturbed(transformers.GPTNeoXForCausalLM, transformers.GPTNeoXConfig(**{**kwargs, **overrides}))
    if equal_norms:   # our block has one norm: NeoX's two must be the same to be this model
        for layer in model.gpt_neox.layers:
            layer.post_attention_layernorm.load_state_dict(layer.input_layernorm.state_dict())
    return model


def test_gpt_neox_logits_export_and_reimport(tmp_path):
    tokens_BT = np.random.RandomState(0).randint(3, V, (2, 13))
    model, _, _ = assert_round_trip(_neox(), str(tmp_path), tokens_BT, TOL)
    assert model.cfg.parallel_block and model.cfg.rope_base == 500.0 and not model.cfg.tie_embeddings


@pytest.mark.parametrize("case, overrides, message", [
    ("two_norms", {}, "input_layernorm and post_attention_layernorm differ"),
    ("sequential", dict(use_parallel_residual=False), "use_parallel_residual=False"),
    ("partial_rotary", dict(rotary_pct=0.25), "partial_rotary_factor"),
])
def test_gpt_neox_it_cannot_represent_is_refused(case, overrides, message, tmp_path):
    _neox(equal_norms=case != "two_norms", **overrides).save_pretrained(str(tmp_path))
    with pytest.raises(ConfigError, match=message):
        from_pretrained(str(tmp_path))
