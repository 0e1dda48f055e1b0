"""model.qk_norm: RMSNorm of each head's queries and keys (one scale of H shared by the heads, before RoPE).

The formula against numpy, the generic causality / packing / decoding-cache tests of every family with it on,
and Hugging Face Qwen3 (the LLaMA layout plus this QK-norm): logits within 1e-4 of `transformers`, export
loaded back by `transformers`, re-import exact."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import test_decoder as generic_decoder
from cheap_init import init_variables
from transformer.inference.generate import generate_seq2seq
from transformer.inference.sampling import SamplingConfig
from transformer.layers.attention import MultiHeadAttention
from transformer.models.encoder import EncoderModel
from transformer.models.encoder_decoder import EncoderDecoderModel
from transformer.spec import ModelConfig

LLAMA_QK = generic_decoder.LLAMA.replace(qk_norm=True, num_layers=1)
GPT2_QK = generic_decoder.GPT2.replace(qk_norm=True, num_layers=1)


def _rms(x: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


@pytest.mark.slow  # CI's 15 minutes: 15 s of the default run on 2 loaded cores (2026-11-27)
def test_attention_normalises_each_heads_queries_and_keys():
    """Bidirectional attention without positions, in numpy from the parameters: softmax(q̂ k̂ᵀ/√H) v with
    q̂ = rms(q)·g_q over each head's H values, k̂ likewise (grouped-query heads share k̂)."""
    cfg = ModelConfig(d_model=24, num_heads=4, num_kv_heads=2, head_dim=8, positional="none", use_bias=False,
                      attention_impl="einsum", qk_norm=True, norm_eps=1e-5)
    layer = MultiHeadAttention(cfg)
    x_BTD = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 24))
    params = init_variables(layer, x_BTD, seed=1)["params"]
    rng = np.random.RandomState(0)
    params = jax.tree.map(lambda p: np.asarray(p) * rng.uniform(0.5, 2.0, np.shape(p)), params)  # scales not 1
    ours = np.asarray(layer.apply({"params": params}, x_BTD))

    x = np.asarray(x_BTD, np.float64)
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    q_BTNH = _rms(np.einsum("btd,dnh->btnh", x, p["query"]["kernel"]), 1e-5) * p["query_norm"]["scale"]
    k_BTKH = _rms(np.einsum("btd,dkh->btkh", x, p["key"]["kernel"]), 1e-5) * p["key_norm"]["scale"]
    v_BTKH = np.einsum("btd,dkh->btkh", x, p["value"]["kernel"])
    k_BTNH, v_BTNH = np.repeat(k_BTKH, 2, axis=2), np.repeat(v_BTKH, 2, axis=2)   # head n reads kv head n // 2
    logits_BNTS = np.einsum("btnh,bsnh->bnts", q_BTNH, k_BTNH) / np.sqrt(8)
    w_BNTS = np.exp(logits_BNTS - logits_BNTS.max(-1, keepdims=True))
    w_BNTS /= w_BNTS.sum(-1, keepdims=True)
    out_BTNH = np.einsum("bnts,bsnh->btnh", w_BNTS, v_BTNH)
    np.testing.assert_allclose(ours, np.einsum("btnh,nhd->btd", out_BTNH, p["out"]["kernel"]), atol=1e-5)


def test_query_and_key_scale_no_longer_matter():
    """With QK-norm, multiplying the query and key kernels by any positive factor leaves the output alone
    (without it, it sharpens the softmax)."""
    x_BTD = jax.random.normal(jax.random.PRNGKey(0), (1, 6, 32))
    for qk_norm, same in ((True, True), (False, False)):
        layer = MultiHeadAttention(ModelConfig(d_model=32, num_heads=4, positional="rope", use_bias=False,
                                               norm_eps=1e-9, qk_norm=qk_norm),
                                   causal=True)
        pos = jnp.arange(6)[None]
        params = init_variables(layer, x_BTD, pos, seed=1)["params"]
        scaled = {**params, "query": {**params["query"], "kernel": params["query"]["kernel"] * 7.0},
                  "key": {**params["key"], "kernel": params["key"]["kernel"] * 3.0}}
        apply = jax.jit(layer.apply)  # one compilation for both parameter sets
        a, b = (np.asarray(apply({"params": p}, x_BTD, pos)) for p in (params, scaled))
        assert np.allclose(a, b, atol=1e-5) == same, qk_norm


# ---- the generic model tests with qk_norm on (test_decoder.py's, called with these configs)

@pytest.mark.slow  # CI's 15 minutes: 18 s of the default run on 2 loaded cores (2026-11-27)
def test_decoder_causal_packed_and_cached():
    generic_decoder.test_causal(GPT2_QK, "chunked")
    generic_decoder.test_packed_segments_do_not_leak(LLAMA_QK, "einsum")
    generic_decoder.test_kv_cache_decoding_matches_full_forward(LLAMA_QK)


def test_encoder_bidirectional_and_segments_apart():
    cfg = ModelConfig(family="encoder", vocab_size=61, d_model=32, num_heads=2, num_layers=1, d_ff=48,
                      positional="rope", norm="rmsnorm", qk_norm=True)
    model = EncoderModel(cfg)
    tokens = jnp.asarray(np.random.RandomState(0).randint(3, 61, (1, 10)), jnp.int32)
    seg = jnp.asarray([[1] * 4 + [2] * 4 + [0] * 2])
    params = init_variables(model, tokens)
    apply = jax.jit(model.apply)  # one compilation for both inputs
    base, changed = (apply(params, t, None, seg) for t in (tokens, tokens.at[0, 6].set(3).at[0, 9].set(3)))
    np.testing.assert_array_equal(base[0, :4], changed[0, :4])          # segment 1 sees neither 2 nor padding
    assert np.abs(np.asarray(changed[0, 4:6] - base[0, 4:6])).max() > 1e-6  # segment 2 sees its later token


@pytest.mark.slow
def test_encoder_decoder_cached_generation_equals_full_forward():
    """Cross-attention keys are normalised once, when the decoding cache is made, and reused."""
    cfg = ModelConfig(family="encoder_decoder", vocab_size=53, d_model=32, num_layers=1, num_heads=4, d_ff=48,
                      positional="rope", norm="rmsnorm", activation="geglu", num_kv_heads=2, qk_norm=True)
    model = EncoderDecoderModel(cfg)
    params = model.init(jax.random.PRNGKey(2), jnp.zeros((1, 8), jnp.int32), jnp.zeros((1, 8), jnp.int32))["params"]
    params = jax.tree.map(lambda p: p * 8.0 if p.ndim > 1 else p, params)
    sources, targets, N = [[5, 6, 7, 8, 9], [12, 13]], [[1], [1, 30, 31]], 3
    out = generate_seq2seq(model, params, sources, targets=targets, max_new_tokens=N,
                           sampling=SamplingConfig(temperature=0.0), return_logits=True)
    for b in range(2):
        tgt = targets[b] + out.tokens_BN[b].tolist()
        full_TV = np.asarray(model.apply({"params": params}, jnp.asarray([sources[b]]), jnp.asarray([tgt])))[0]
        P = len(targets[b])
        np.testing.assert_allclose(out.logits_BNV[b], full_TV[P - 1:P - 1 + N], atol=2e-5, rtol=0)


# ---- Hugging Face Qwen3

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from hf_checks import assert_round_trip, hf_logits, perturbed  # noqa: E402

V, TOL = 101, 1e-4


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_qwen3_logits_export_and_reimport(tie, tmp_path):
    hf = perturbed(transformers.Qwen3ForCausalLM, transformers.Qwen3Config(
        vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
        intermediate_size=96, rms_norm_eps=1e-5, tie_word_embeddings=tie, bos_token_id=1, eos_token_id=2,
        pad_token_id=0))
    tokens_BT = np.random.RandomState(0).randint(3, V, (2, 13))
    model, params, _ = assert_round_trip(hf, str(tmp_path), tokens_BT, TOL)
    assert model.cfg.qk_norm and model.cfg.dim_per_head == 24 and model.cfg.tie_embeddings == tie
    # without the QK-norm the same weights give other logits: the norms are really applied
    plain = model.clone(cfg=model.cfg.replace(qk_norm=False))
    no_norm = {**params, "blocks": {k: {**b, "attention": {n: w for n, w in b["attention"].items()
                                                           if not n.endswith("_norm")}}
                                    for k, b in params["blocks"].items()}}
    ref = hf_logits(hf, tokens_BT)
    assert np.abs(np.asarray(plain.apply({"params": no_norm}, jnp.asarray(tokens_BT))) - ref).max() > 1e-2
