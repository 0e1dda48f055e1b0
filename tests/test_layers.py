"""Attention, positions, feed-forward and norms against independent formulas."""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer.layers.attention import MultiHeadAttention
from transformer.layers.sdpa import dot_product_attention, dot_product_attention_einsum, make_attention_mask
from transformer.layers.feedforward import FeedForward
from transformer.layers.norms import make_norm
from transformer.layers.positional import apply_rope, sinusoidal_table
from transformer.spec import ConfigError, ModelConfig

B, T, N, H = 2, 10, 4, 8


def _qkv(K: int, seed: int = 0, S: int = T):
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
    return (jax.random.normal(kq, (B, T, N, H)), jax.random.normal(kk, (B, S, K, H)),
            jax.random.normal(kv, (B, S, K, H)))


def _naive_mha(q, k, v, mask_TS=None):
    """Per-batch, per-head numpy attention: an implementation independent of the code under test."""
    q, k, v = map(np.asarray, (q, k, v))
    out = np.zeros_like(q)
    for b in range(q.shape[0]):
        for n in range(q.shape[2]):
            logits = q[b, :, n] @ k[b, :, n].T / math.sqrt(q.shape[-1])
            if mask_TS is not None:
                logits = np.where(mask_TS, logits, -np.inf)
            w = np.exp(logits - logits.max(-1, keepdims=True))
            out[b, :, n] = (w / w.sum(-1, keepdims=True)) @ v[b, :, n]
    return out


def test_sinusoidal_matches_formula():
    table = np.asarray(sinusoidal_table(jnp.array([0, 1, 3]), 4))
    # d=4: frequencies 1 and 10000^(-2/4) = 1/100; even entries sin, odd entries cos.
    np.testing.assert_allclose(table[0], [0.0, 1.0, 0.0, 1.0], atol=1e-7)
    np.testing.assert_allclose(table[1], [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)], rtol=1e-6)
    np.testing.assert_allclose(table[2], [math.sin(3), math.cos(3), math.sin(0.03), math.cos(0.03)], rtol=1e-6)
    assert sinusoidal_table(jnp.zeros((2, 5), jnp.int32), 6).shape == (2, 5, 6)


def _rope_reference(x_H: np.ndarray, position: int, base: float) -> np.ndarray:
    """Rotate-half RoPE as complex numbers: z_i = x_i + j·x_{i+H/2} times exp(j·position·theta_i),
    theta_i = base^(-2i/H) (Su et al. 2021; HF LLaMA's layout), in float64."""
    H = x_H.shape[-1]
    theta_h = base ** (-2.0 * np.arange(H // 2) / H)
    z_h = (x_H[: H // 2] + 1j * x_H[H // 2:]) * np.exp(1j * position * theta_h)
    return np.concatenate([z_h.real, z_h.imag])


def test_rope_dot_product_depends_only_on_offset():
    kq, kk = jax.random.split(jax.random.PRNGKey(1))
    q = jax.random.normal(kq, (1, 1, 1, 16))
    k = jax.random.normal(kk, (1, 1, 1, 16))

    def score(pq: int, pk: int) -> float:
        rq = apply_rope(q, jnp.array([[pq]]), 100.0)
        rk = apply_rope(k, jnp.array([[pk]]), 100.0)
        return float(jnp.sum(rq * rk))

    for offset in (0, 3, 7):
        scores = [score(p + offset, p) for p in (0, 5, 19, 40)]
        np.testing.assert_allclose(scores, scores[0], rtol=1e-4, atol=1e-4)
    assert abs(score(3, 0) - score(0, 0)) > 1e-3  # the offset does matter
    np.testing.assert_allclose(apply_rope(q, jnp.array([[0]])), q, atol=1e-7)  # position 0: identity
    # the frequency schedule itself (any schedule keeps the offset property above): each pair (i, i + H/2)
    # turns by position * base^(-2i/H), for every pair, against an independent float64 computation
    for base in (100.0, 10000.0):
        for position in (1, 7, 300):
            got = np.asarray(apply_rope(q, jnp.array([[position]]), base))[0, 0, 0]
            np.testing.assert_allclose(got, _rope_reference(np.asarray(q, np.float64)[0, 0, 0], position, base),
                                       atol=2e-4, rtol=0)
    x = jnp.zeros((1, 1, 1, 16)).at[..., 5].set(1.0)  # pair 5 alone: cos and sin of 2 * 100^(-10/16)
    angle = 2 * 100.0 ** (-10 / 16)
    np.testing.assert_allclose(apply_rope(x, jnp.array([[2]]), 100.0)[0, 0, 0],
                               np.eye(16)[5] * math.cos(angle) + np.eye(16)[13] * math.sin(angle), atol=1e-6)


def test_gqa_with_all_heads_equals_independent_mha():
    q, k, v = _qkv(K=N)
    causal = np.tril(np.ones((T, T), bool))
    out = dot_product_attention_einsum(q, k, v, make_attention_mask(T, T, causal=True))
    np.testing.assert_allclose(out, _naive_mha(q, k, v, causal), atol=1e-5)


@pytest.mark.parametrize("K", [1, 2])
def test_gqa_equals_mha_with_repeated_kv_heads(K):
    q, k, v = _qkv(K=K)
    rep_k, rep_v = jnp.repeat(k, N // K, axis=2), jnp.repeat(v, N // K, axis=2)
    for impl in ("einsum", "chunked"):
        out = dot_product_attention(q, k, v, causal=True, implementation=impl)
        np.testing.assert_allclose(out, _naive_mha(q, rep_k, rep_v, np.tril(np.ones((T, T), bool))), atol=1e-5)


@pytest.mark.parametrize("causal,segments,window,K", [
    (True, False, 0, 4), (True, True, 0, 2), (True, False, 3, 1), (False, True, 0, 2),
    (False, False, 3, 4), (True, True, 4, 2), (False, True, 3, 1)])
def test_einsum_reference_equals_jax_attention(causal, segments, window, K):
    q, k, v = _qkv(K=K, seed=3)
    seg = jnp.array([[1] * 4 + [2] * 4 + [0] * 2, [1] * 7 + [2] * 3]) if segments else None
    kw = dict(causal=causal, q_segment_ids_BT=seg, kv_segment_ids_BS=seg, sliding_window=window)
    ref = dot_product_attention(q, k, v, implementation="einsum", **kw)
    np.testing.assert_allclose(ref, dot_product_attention(q, k, v, implementation="chunked", **kw), atol=1e-5)
    direct = jax.nn.dot_product_attention(q, k, v, mask=make_attention_mask(T, T, **kw))
    np.testing.assert_allclose(ref, direct, atol=1e-5)


@pytest.mark.parametrize("causal,segments,window,K,S", [
    (True, False, 0, 4, 150), (True, True, 0, 2, 150), (True, True, 40, 1, 150), (False, True, 0, 2, 150),
    (False, False, 0, 4, 37)])
@pytest.mark.slow
def test_chunked_attention_and_its_gradients_equal_the_reference(causal, segments, window, K, S):
    """T = 150 queries make 3 causal chunks (the skipped key blocks and the written-out backward are
    exercised); S = 37 is cross-attention-shaped (T != S)."""
    T, rng = 150, np.random.default_rng(5)
    q = jnp.asarray(rng.normal(size=(2, T, N, H)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(2, S, K, H)), jnp.float32) for _ in range(2))
    seg = jnp.asarray(np.sort(rng.integers(0, 3, size=(2, T)), axis=1)) if segments else None
    kw = dict(causal=causal, q_segment_ids_BT=seg, kv_segment_ids_BS=seg, sliding_window=window)

    def loss(impl):
        return lambda q, k, v: jnp.sum(jnp.sin(dot_product_attention(q, k, v, implementation=impl, **kw)))

    ref = jax.value_and_grad(loss("einsum"), argnums=(0, 1, 2))(q, k, v)
    got = jax.jit(jax.value_and_grad(loss("chunked"), argnums=(0, 1, 2)))(q, k, v)
    for r, g in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=2e-5)


def test_chunked_attention_skips_the_masked_key_blocks():
    """The speed of "chunked" comes from its spans: each causal chunk reads keys only up to its last query
    (and from its first query - window + 1); a bidirectional call is one chunk over all keys."""
    from transformer.layers.chunked_attention import _spans

    assert _spans(256, 256, causal=True, window=0) == ((0, 64, 0, 64), (64, 128, 0, 128), (128, 192, 0, 192),
                                                        (192, 256, 0, 256))
    assert _spans(150, 150, causal=True, window=40)[2] == (100, 150, 61, 150)
    assert _spans(37, 53, causal=False, window=0) == ((0, 37, 0, 53),)
    computed = sum((q1 - q0) * (k1 - k0) for q0, q1, k0, k1 in _spans(256, 256, causal=True, window=0))
    assert computed == 0.625 * 256 * 256


def test_mask_semantics():
    seg = jnp.array([[1, 1, 2, 2, 0]])
    m = np.asarray(make_attention_mask(5, 5, causal=True, q_segment_ids_BT=seg, kv_segment_ids_BS=seg,
                                       sliding_window=0))[0, 0]
    expected = np.array([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 0, 1]], bool)
    np.testing.assert_array_equal(m, expected)
    w = np.asarray(make_attention_mask(5, 5, causal=True, sliding_window=2))[0, 0]
    np.testing.assert_array_equal(w, np.tril(np.ones((5, 5), bool)) & ~np.tril(np.ones((5, 5), bool), -2))


def test_attention_weights_are_causal_distributions_and_match_output():
    cfg = ModelConfig(d_model=32, num_heads=4, num_kv_heads=2, positional="rope", use_bias=False)
    x = jax.random.normal(jax.random.PRNGKey(0), (B, T, 32))
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    mha = MultiHeadAttention(cfg, causal=True)
    params = mha.init(jax.random.PRNGKey(1), x, pos)
    out, w = mha.apply(params, x, pos, return_weights=True)
    np.testing.assert_allclose(out, mha.apply(params, x, pos), atol=1e-5)  # the configured path ("auto"), no weights
    assert w.shape == (B, 4, T, T)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    assert float(jnp.abs(jnp.triu(w, 1)).max()) == 0.0


def test_cross_attention_respects_context_segments():
    cfg = ModelConfig(d_model=32, num_heads=4, positional="rope")
    x = jax.random.normal(jax.random.PRNGKey(0), (1, 6, 32))
    ctx = jax.random.normal(jax.random.PRNGKey(1), (1, 8, 32))
    q_seg, ctx_seg = jnp.array([[1, 1, 1, 2, 2, 2]]), jnp.array([[1] * 3 + [2] * 4 + [0]])
    mha = MultiHeadAttention(cfg)
    params = mha.init(jax.random.PRNGKey(2), x, None, q_seg, ctx, ctx_seg)
    assert params["params"]["key"]["kernel"].value.shape == (32, 4, 8)
    out = mha.apply(params, x, None, q_seg, ctx, ctx_seg)
    ctx2 = ctx.at[:, 3:].set(jax.random.normal(jax.random.PRNGKey(3), (1, 5, 32)))  # segment 2 + pad
    out2 = mha.apply(params, x, None, q_seg, ctx2, ctx_seg)
    np.testing.assert_allclose(out[:, :3], out2[:, :3], atol=1e-6)
    assert float(jnp.abs(out[:, 3:] - out2[:, 3:]).max()) > 1e-3


def test_cudnn_needs_half_precision():
    """Checked once, when the config is made (not when a layer is traced)."""
    with pytest.raises(ConfigError, match="attention_impl='cudnn' needs train.compute_dtype='bfloat16'"):
        ModelConfig(d_model=32, num_heads=4, attention_impl="cudnn")
    ModelConfig(d_model=32, num_heads=4, attention_impl="cudnn", dtype="bfloat16")


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "swiglu", "geglu"])
def test_feedforward_matches_formula(activation):
    cfg = ModelConfig(d_model=16, num_heads=2, d_ff=24, activation=activation, use_bias=not activation.endswith("glu"))
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 16))
    ffn = FeedForward(cfg)
    p = nn.unbox(ffn.init(jax.random.PRNGKey(1), x)["params"])
    act = {"relu": jax.nn.relu, "gelu": lambda h: jax.nn.gelu(h, approximate=False),
           "gelu_tanh": lambda h: 0.5 * h * (1 + jnp.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3))),
           "swiglu": lambda h: h * jax.nn.sigmoid(h),
           "geglu": lambda h: 0.5 * h * (1 + jax.scipy.special.erf(h / math.sqrt(2)))}[activation]
    if cfg.gated:
        assert "bias" not in p["wi_gate"]
        h = act(x @ p["wi_gate"]["kernel"]) * (x @ p["wi_up"]["kernel"])
        expected = h @ p["wo"]["kernel"]
    else:
        h = act(x @ p["wi"]["kernel"] + p["wi"]["bias"])
        expected = h @ p["wo"]["kernel"] + p["wo"]["bias"]
    np.testing.assert_allclose(ffn.apply({"params": p}, x), expected, atol=1e-5)


def test_norms():
    """Both norms against their formulas, with a non-trivial scale and bias (ones and zeros would hide a norm
    that ignores them)."""
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 3, 8)) * 3 + 1
    k_scale, k_bias = jax.random.split(jax.random.PRNGKey(5))
    scale_D = jax.random.uniform(k_scale, (8,), minval=0.5, maxval=2.0)
    bias_D = jax.random.normal(k_bias, (8,))
    rms_cfg = ModelConfig(d_model=8, num_heads=2, norm="rmsnorm", norm_eps=1e-6)
    rms = make_norm(rms_cfg, "n")
    p = rms.init(jax.random.PRNGKey(0), x)
    assert set(p["params"]) == {"scale"}
    p = {"params": {"scale": scale_D}}
    np.testing.assert_allclose(rms.apply(p, x), x / jnp.sqrt(jnp.mean(x ** 2, -1, keepdims=True) + 1e-6) * scale_D,
                               rtol=1e-5, atol=1e-6)
    ln = make_norm(ModelConfig(d_model=8, num_heads=2), "n")
    p = ln.init(jax.random.PRNGKey(0), x)
    assert set(p["params"]) == {"scale", "bias"}
    assert nn.get_partition_spec(p)["params"]["scale"] == jax.sharding.PartitionSpec("norm")
    y = ln.apply({"params": {"scale": scale_D, "bias": bias_D}}, x)
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    eps = ModelConfig().norm_eps
    np.testing.assert_allclose(y, (x - mean) / jnp.sqrt(var + eps) * scale_D + bias_D, rtol=1e-5, atol=1e-5)
    no_bias = make_norm(ModelConfig(d_model=8, num_heads=2, use_bias=False), "n").init(jax.random.PRNGKey(0), x)
    assert set(no_bias["params"]) == {"scale"}


@pytest.mark.parametrize("bias_shape,causal,K,S", [((1, N, 150, 150), True, 2, 150), ((2, 1, 150, 150), True, 1, 150),
                                                  ((1, N, 150, 37), False, 4, 37)])
def test_chunked_attention_with_a_bias_and_a_scale_equals_the_reference(bias_shape, causal, K, S):
    """A position bias (shared by the batch, or by the heads) and a scale other than 1/sqrt(H): "chunked" and
    its written-out backward, the bias's gradient included (T5's table trains through it), against einsum;
    the einsum reference itself against jax.nn.dot_product_attention."""
    T, rng = 150, np.random.default_rng(6)
    q = jnp.asarray(rng.normal(size=(2, T, N, H)), jnp.float32)
    k, v = (jnp.asarray(rng.normal(size=(2, S, K, H)), jnp.float32) for _ in range(2))
    bias = jnp.asarray(rng.normal(size=bias_shape) * 3, jnp.float32)
    kw = dict(causal=causal, scale=0.7)

    def loss(impl):
        return lambda q, k, v, b: jnp.sum(jnp.sin(dot_product_attention(q, k, v, implementation=impl,
                                                                        bias_BNTS=b, **kw)))

    ref = jax.jit(jax.value_and_grad(loss("einsum"), argnums=(0, 1, 2, 3)))(q, k, v, bias)
    got = jax.jit(jax.value_and_grad(loss("chunked"), argnums=(0, 1, 2, 3)))(q, k, v, bias)
    for r, g in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=5e-5)
    assert float(jnp.abs(ref[1][3]).max()) > 0.1          # the bias gradient is not trivially zero
    out = dot_product_attention(q, k, v, implementation="einsum", bias_BNTS=bias, **kw)
    direct = jax.nn.dot_product_attention(q, k, v, bias=jnp.broadcast_to(bias, (2, N, T, S)), scale=0.7,
                                          mask=make_attention_mask(T, S, causal=causal))
    np.testing.assert_allclose(out, direct, atol=1e-5)
