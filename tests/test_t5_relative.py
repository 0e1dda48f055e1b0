"""T5's bucketed relative position bias (Raffel et al. 2020): buckets against Hugging Face's implementation and
T5's hand-checkable values, one table per stack shared by every layer (bidirectional in the encoder,
unidirectional in the decoder), KV-cache decoding, parameter counts and bad settings."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.spec import ConfigError, ModelConfig
from transformer.inference.attention_maps import attention_maps
from transformer.inference.generate import generate, generate_seq2seq
from transformer.inference.sampling import SamplingConfig
from transformer.layers.t5_relative import relative_position_bucket
from transformer.models import build_model
from transformer.spec import param_counts

T5 = dict(vocab_size=61, d_model=32, num_layers=2, num_heads=4, d_ff=64, positional="t5_relative", norm="rmsnorm",
          activation="geglu", use_bias=False, tie_embeddings=False, relative_num_buckets=8, relative_max_distance=20)


def _buckets(rel, bidirectional, num_buckets=32, max_distance=128):
    return np.asarray(relative_position_bucket(jnp.asarray(rel), bidirectional=bidirectional,
                                               num_buckets=num_buckets, max_distance=max_distance))


def test_buckets_by_hand_for_t5s_defaults():
    """32 buckets, max distance 128. Bidirectional: keys before the query in 0–15, after it in 16–31; offsets
    below 8 exact, then logarithmic up to 128, beyond which all share the last bucket. Unidirectional: keys
    after the query all fall in bucket 0; 0–15 exact, then logarithmic."""
    rel = np.array([0, -1, -7, -8, -12, -16, -127, -128, -5000, 1, 7, 8, 16, 128, 5000])
    assert _buckets(rel, True).tolist() == [0, 1, 7, 8, 9, 10, 15, 15, 15, 17, 23, 24, 26, 31, 31]
    rel = np.array([0, 5, -1, -15, -16, -32, -64, -127, -128, -5000])
    assert _buckets(rel, False).tolist() == [0, 0, 1, 15, 16, 21, 26, 31, 31, 31]


@pytest.mark.parametrize("bidirectional", [True, False])
def test_buckets_equal_hugging_faces(bidirectional):
    torch = pytest.importorskip("torch")
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    rel = np.arange(-3000, 3000)
    for num_buckets, max_distance in [(32, 128), (8, 20), (16, 64), (64, 256), (33, 100), (10, 1000)]:
        ref = t5.T5Attention._relative_position_bucket(torch.tensor(rel), bidirectional, num_buckets, max_distance)
        np.testing.assert_array_equal(_buckets(rel, bidirectional, num_buckets, max_distance), ref.numpy(),
                                      err_msg=f"{num_buckets} buckets, max distance {max_distance}")


def _zero_queries(params):
    def zero(path, x):
        return jnp.zeros_like(x) if any(getattr(k, "key", None) == "query" for k in path) else x
    return jax.tree_util.tree_map_with_path(zero, params)


@pytest.mark.slow
def test_one_table_per_stack_shared_by_every_layer():
    """The encoder–decoder holds one (buckets, heads) table per stack and none in the layers. With q = 0 every
    self-attention logit is the bias alone: each layer's weights are softmax(table[bucket(j − i)]) of its
    stack, with bidirectional buckets in the encoder and unidirectional ones in the decoder."""
    cfg = ModelConfig(**T5, family="encoder_decoder", num_encoder_layers=3)
    model = build_model(cfg)
    S, T = 30, 25  # offsets past max_distance 20: the logarithmic and the shared last buckets are used
    params = model.init(jax.random.PRNGKey(0), jnp.ones((1, S), jnp.int32), jnp.ones((1, T), jnp.int32))["params"]
    params = nn.unbox(params)
    tables = {"/".join(str(getattr(k, "key", k)) for k in path[:-1]): x.shape
              for path, x in jax.tree_util.tree_leaves_with_path(params) if "relative_position_bias" in str(path)}
    assert tables == {"encoder/relative_position_bias": (8, 4), "decoder/relative_position_bias": (8, 4)}
    params = jax.tree.map(lambda p: p, params)
    params["encoder"]["relative_position_bias"]["embedding"] = jnp.asarray(
        np.random.default_rng(0).normal(size=(8, 4)) * 2, jnp.float32)
    params["decoder"]["relative_position_bias"]["embedding"] = jnp.asarray(
        np.random.default_rng(1).normal(size=(8, 4)) * 2, jnp.float32)
    rng = np.random.default_rng(2)
    src, tgt = (jnp.asarray(rng.integers(3, 61, (1, n)), jnp.int32) for n in (S, T))
    maps = attention_maps(model, _zero_queries(params), src, tgt)
    for stack, L, n, bidirectional in (("encoder", 3, S, True), ("decoder", 2, T, False)):
        table = np.asarray(params[stack]["relative_position_bias"]["embedding"])
        i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
        logits_NTS = np.moveaxis(table[_buckets(j - i, bidirectional, 8, 20)], -1, 0)
        if not bidirectional:
            logits_NTS = np.where(j <= i, logits_NTS, -np.inf)
        expected = np.exp(logits_NTS - logits_NTS.max(-1, keepdims=True))
        expected /= expected.sum(-1, keepdims=True)
        for layer in range(L):
            np.testing.assert_allclose(maps[f"{stack}/blocks/layers_{layer}/attention"][0], expected, atol=1e-6)
    # cross-attention carries no bias: with q = 0 it spreads evenly over the source
    np.testing.assert_allclose(maps["decoder/blocks/layers_1/cross_attention"][0], 1.0 / S, atol=1e-6)


def _scaled(model, *init_args):
    params = model.init(jax.random.PRNGKey(1), *init_args)["params"]
    return jax.tree.map(lambda p: p * 8.0 if p.ndim > 1 else p, params)


@pytest.mark.slow
def test_seq2seq_cached_generation_equals_full_forward():
    """Ragged sources and target prefixes decoded with the cache: each step's decoder bias is its query's cache
    slot against every slot; every token's logits equal the teacher-forced pass over that example alone."""
    cfg = ModelConfig(**T5, family="encoder_decoder", num_kv_heads=2, scan_layers=True)
    model = build_model(cfg)
    params = _scaled(model, jnp.zeros((1, 8), jnp.int32), jnp.zeros((1, 8), jnp.int32))
    sources, targets, N = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]], [[1], [1, 30, 31], [1, 40]], 24
    out = generate_seq2seq(model, params, sources, targets=targets, max_new_tokens=N,
                           sampling=SamplingConfig(temperature=0.0), return_logits=True)
    # one compilation: sources padded (segment id 0) to 8, targets right-padded to 28 (a causal decoder)
    full = jax.jit(lambda src, seg, tgt: model.apply({"params": params}, src, tgt, seg))
    for b in range(3):
        tgt = targets[b] + out.tokens_BN[b].tolist()
        src, seg = np.zeros((1, 8), np.int32), np.zeros((1, 8), np.int32)
        src[0, :len(sources[b])], seg[0, :len(sources[b])] = sources[b], 1
        full_TV = np.asarray(full(src, seg, np.asarray([tgt + [0] * (28 - len(tgt))], np.int32)))[0]
        P = len(targets[b])
        np.testing.assert_allclose(out.logits_BNV[b], full_TV[P - 1:P - 1 + N], atol=5e-5, rtol=0)
    assert np.abs(np.diff(out.logits_BNV, axis=1)).max() > 1e-2


@pytest.mark.slow  # CI's 15 minutes: 40 s of the default run on 2 loaded cores (2026-11-27)
def test_decoder_lm_cached_generation_equals_full_forward():
    model = build_model(ModelConfig(**T5))
    params = _scaled(model, jnp.zeros((1, 8), jnp.int32))
    prompts, N = [[1, 40, 41, 42, 43, 44, 45], [1, 50], [1, 30, 31, 32]], 6
    out = generate(model, params, prompts, max_new_tokens=N, sampling=SamplingConfig(temperature=0.0),
                   return_logits=True)
    full = jax.jit(lambda tokens_BT: model.apply({"params": params}, tokens_BT))
    for b, prompt in enumerate(prompts):
        seq = prompt + out.tokens_BN[b].tolist()   # right-padded to 16: one shape, one compilation
        full_TV = np.asarray(full(np.asarray([seq + [0] * (16 - len(seq))], np.int32)))[0]
        np.testing.assert_allclose(out.logits_BNV[b], full_TV[len(prompt) - 1:len(prompt) - 1 + N], atol=2e-5)


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder"])
def test_param_counts_include_one_table_per_stack(family):
    cfg = ModelConfig(**T5, family=family)
    args = (jnp.ones((1, 6), jnp.int32),) * (2 if family == "encoder_decoder" else 1)
    params = nn.unbox(jax.eval_shape(build_model(cfg).init, jax.random.PRNGKey(0), *args)["params"])
    total = int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
    counts = param_counts(cfg)
    assert counts["total"] == total
    tables = 8 * 4 * (2 if family == "encoder_decoder" else 1)
    assert counts["embedding"] == cfg.vocab_size * cfg.d_model + tables


@pytest.mark.parametrize("change,match", [
    (dict(relative_num_buckets=2), "relative_num_buckets=2 must be at least 4"),
    (dict(relative_num_buckets=32, relative_max_distance=16), "relative_max_distance=16 must exceed"),
    (dict(attention_scale=-1.0), "attention_scale=-1.0 must be a number >= 0"),
    (dict(scale_tied_head=True), "scale_tied_head=True .* needs model.family='encoder_decoder'"),
])
def test_bad_settings_are_config_errors(change, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig(**{**T5, **change})


@pytest.mark.parametrize("positional", [pytest.param("t5_relative", marks=pytest.mark.slow), "alibi"])  # CI's 15 minutes (2026-11-27): 63 s
def test_packed_documents_get_the_bias_of_their_own_positions(positional):
    """Slot offsets stand for position offsets: the second document of a packed row (slots 5–9, positions 0–4)
    gets exactly the logits it gets alone, and nothing leaks from the first (decoder, causal)."""
    cfg = ModelConfig(**dict(T5, positional=positional))
    model = build_model(cfg)
    seg = jnp.array([[1] * 5 + [2] * 5 + [0] * 2])
    pos = jnp.array([list(range(5)) + list(range(5)) + [0, 0]])
    tok = jnp.asarray(np.random.default_rng(4).integers(3, 61, (1, 12)), jnp.int32)
    params = _scaled(model, tok)
    logits = model.apply({"params": params}, tok, pos, seg)
    alone = model.apply({"params": params}, tok[:, 5:10])
    np.testing.assert_allclose(logits[:, 5:10], alone, atol=1e-5)
    changed = model.apply({"params": params}, tok.at[:, :5].set((tok[:, :5] + 3) % 61), pos, seg)
    np.testing.assert_allclose(changed[:, 5:10], logits[:, 5:10], atol=1e-6)
