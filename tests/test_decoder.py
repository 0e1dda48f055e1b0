"""DecoderLM: causality, packing, decoding cache, scan/remat equivalence, sharding names, dtypes."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import unfreeze

from configs.common import DEFAULT_RULES
from transformer.models import build_model
from transformer.models.blocks import LAYERS_AXIS, TransformerBlock
from transformer.spec import ModelConfig
from transformer.models.decoder import DecoderLM

SMALL = dict(vocab_size=50, d_model=32, num_layers=2, num_heads=4, d_ff=64, max_len=32)
GPT2 = ModelConfig(**SMALL)  # learned positions, pre-LN LayerNorm, GELU, biases, tied head
LLAMA = ModelConfig(**SMALL, positional="rope", norm="rmsnorm", activation="swiglu", num_kv_heads=2,
                    tie_embeddings=False, use_bias=False)
T = 12


def _tokens(seed: int = 0, shape=(2, T)) -> jax.Array:
    return jax.random.randint(jax.random.PRNGKey(seed), shape, 1, 50)


@functools.lru_cache(maxsize=None)
def _init_shaped(cfg: ModelConfig, shape: tuple[int, int]):
    model = DecoderLM(cfg)
    return model, nn.unbox(model.init(jax.random.PRNGKey(0), jnp.ones(shape, jnp.int32)))


def _init(cfg: ModelConfig, tokens: jax.Array):
    """(model, variables), cached per config: tests share the parameters of the same config."""
    return _init_shaped(cfg, tuple(tokens.shape))


@pytest.mark.parametrize("impl", ["einsum", "chunked"])
@pytest.mark.parametrize("base", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_causal(base, impl):
    tok = _tokens()
    params = _init(base, tok)[1]
    model = DecoderLM(base.replace(attention_impl=impl))
    logits = model.apply(params, tok)
    assert logits.dtype == jnp.float32 and logits.shape == (2, T, 50)
    t = 5
    changed = tok.at[:, t + 1:].set((tok[:, t + 1:] + 7) % 50)
    logits2 = model.apply(params, changed)
    np.testing.assert_allclose(logits[:, :t + 1], logits2[:, :t + 1], atol=1e-5)
    assert float(jnp.abs(logits[:, t + 1:] - logits2[:, t + 1:]).max()) > 1e-4


@pytest.mark.parametrize("impl", ["einsum", "chunked"])
@pytest.mark.parametrize("base", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_packed_segments_do_not_leak(base, impl):
    cfg = base.replace(attention_impl=impl)
    n1, n2 = 5, 5  # segment 1, segment 2, then 2 padding tokens
    seg = jnp.array([[1] * n1 + [2] * n2 + [0] * (T - n1 - n2)])
    pos = jnp.array([list(range(n1)) + list(range(n2)) + [0] * (T - n1 - n2)])
    tok = _tokens(1, (1, T))
    params = _init(base, tok)[1]
    model = DecoderLM(cfg)
    logits = model.apply(params, tok, pos, seg)
    changed = tok.at[:, n1:].set((tok[:, n1:] + 3) % 50)
    logits2 = model.apply(params, changed, pos, seg)
    np.testing.assert_allclose(logits[:, :n1], logits2[:, :n1], atol=1e-5)
    alone = model.apply(params, tok[:, n1:n1 + n2])  # segment 2 as its own sequence, positions from 0
    np.testing.assert_allclose(logits[:, n1:n1 + n2], alone, atol=1e-5)


def test_sliding_window_limits_receptive_field():
    cfg = LLAMA.replace(num_layers=1, sliding_window=3)
    tok = _tokens(2)
    model, params = _init(cfg, tok)
    changed = tok.at[:, 0].set((tok[:, 0] + 1) % 50)
    a, b = model.apply(params, tok), model.apply(params, changed)
    np.testing.assert_allclose(a[:, 3:], b[:, 3:], atol=1e-5)  # position 3 sees 1..3 only
    assert float(jnp.abs(a[:, :3] - b[:, :3]).max()) > 1e-4


@pytest.mark.parametrize("base", [GPT2, LLAMA.replace(scan_layers=True, sliding_window=5)],
                         ids=["gpt2", "llama_scan_window"])
def test_kv_cache_decoding_matches_full_forward(base):
    tok = _tokens(3, (2, T))
    model, params = _init(base, tok)
    full = model.apply(params, tok)
    cache = jax.jit(functools.partial(model.init, decode=True))(jax.random.PRNGKey(0), tok)["cache"]
    pos = jnp.broadcast_to(jnp.arange(T), (2, T))
    prefill = 4
    step = jax.jit(functools.partial(model.apply, decode=True, mutable=["cache"]))
    logits, mut = step({**params, "cache": cache}, tok[:, :prefill], pos[:, :prefill])
    steps = [logits]
    for t in range(prefill, T):  # even steps pass positions, odd ones rely on the cached count
        step_pos = pos[:, t:t + 1] if t % 2 == 0 else None
        logits, mut = step({**params, "cache": mut["cache"]}, tok[:, t:t + 1], step_pos)
        steps.append(logits)
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)


@pytest.mark.parametrize("cfg", [GPT2, GPT2.replace(scan_layers=True)], ids=["layers", "scanned"])
def test_decoding_past_the_cache_is_an_error(cfg):
    """dynamic_update_slice clamps its start: without the check the 5th token would overwrite slot 3.
    Scanned layers are checked once by the stack, outside nn.scan (blocks.py)."""
    from transformer.layers.attention import CacheOverflowError
    tok = _tokens(3, (2, 4))
    model, params = _init(cfg, tok)
    cache = model.init(jax.random.PRNGKey(0), tok, decode=True)["cache"]  # 4 slots
    step = functools.partial(model.apply, decode=True, mutable=["cache"])
    _, mut = step({**params, "cache": cache}, tok[:, :3])
    _, mut = step({**params, "cache": mut["cache"]}, tok[:, 3:4])  # slot 3: exactly full
    with pytest.raises(CacheOverflowError, match="cache slot 4 need 5 slots but the cache holds 4"):
        step({**params, "cache": mut["cache"]}, tok[:, :1])  # eager: a Python error
    jitted = jax.jit(step)
    _, mut = jitted({**params, "cache": cache}, tok[:, :3])
    with pytest.raises(Exception, match="cache slot 3 need 5 slots but the cache holds 4"):
        jax.block_until_ready(jitted({**params, "cache": mut["cache"]}, tok[:, :2]))  # under jit
    with pytest.raises(CacheOverflowError, match="need 6 slots"):
        step({**params, "cache": cache}, _tokens(3, (2, 6)))  # longer than the cache: at trace time


def _restack(unrolled: dict, num_layers: int) -> dict:
    layers = [unrolled["blocks"].pop(f"layers_{i}") for i in range(num_layers)]
    unrolled["blocks"]["layers"] = jax.tree.map(lambda *xs: jnp.stack(xs), *layers)
    return unrolled


@pytest.mark.parametrize("base", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_scan_equals_unrolled(base):
    tok = _tokens(4)
    model, params = _init(base, tok)
    scanned_cfg = base.replace(scan_layers=True)
    scanned_model, scanned_params = _init(scanned_cfg, tok)
    restacked = _restack(unfreeze(params["params"]), base.num_layers)
    assert jax.tree.map(jnp.shape, restacked) == jax.tree.map(jnp.shape, scanned_params["params"])
    np.testing.assert_allclose(jax.jit(scanned_model.apply)({"params": restacked}, tok),
                               jax.jit(model.apply)(params, tok), atol=1e-5)


@pytest.mark.parametrize("remat", ["full", "dots", "dots_no_batch"])
def test_remat_gives_same_gradients(remat):
    tok = _tokens(5)
    model, params = _init(LLAMA, tok)
    remat_model = DecoderLM(LLAMA.replace(remat=remat, scan_layers=remat == "dots"))
    remat_params = params if remat != "dots" else {"params": _restack(unfreeze(params["params"]), 2)}

    def loss(m, p):
        return jnp.mean(jax.nn.log_softmax(m.apply(p, tok))[..., 0])

    g = jax.jit(jax.grad(lambda p: loss(model, p)))(params)
    g_remat = jax.jit(jax.grad(lambda p: loss(remat_model, p)))(remat_params)
    if remat == "dots":
        g = {"params": _restack(unfreeze(g["params"]), 2)}
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_remat)):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("cfg", [GPT2, LLAMA, LLAMA.replace(scan_layers=True)], ids=["gpt2", "llama", "scan"])
def test_every_param_has_logical_axis_names(cfg):
    tok = _tokens()
    boxed = jax.eval_shape(DecoderLM(cfg).init, jax.random.PRNGKey(0), tok)
    specs = nn.get_partition_spec(boxed)["params"]
    shapes = jax.tree.map(jnp.shape, nn.unbox(boxed["params"]))
    known = {name for name, _ in DEFAULT_RULES} | {LAYERS_AXIS, "seq"}
    flat_specs = jax.tree_util.tree_leaves_with_path(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    flat_shapes = dict(jax.tree_util.tree_leaves_with_path(shapes, is_leaf=lambda x: isinstance(x, tuple)))
    assert len(flat_specs) == len(flat_shapes)
    for path, spec in flat_specs:
        assert isinstance(spec, jax.sharding.PartitionSpec), path
        assert len(spec) == len(flat_shapes[path]), (path, spec)
        assert all(name in known for name in spec), (path, spec)


def test_bfloat16_compute_gives_float32_logits_close_to_float32():
    tok = _tokens(6)
    model, params = _init(LLAMA, tok)
    bf16 = DecoderLM(LLAMA.replace(dtype="bfloat16"))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(jax.eval_shape(bf16.init, jax.random.PRNGKey(0), tok)))
    ref, low = model.apply(params, tok), bf16.apply(params, tok)
    assert low.dtype == jnp.float32
    assert float(jnp.abs(ref - low).max()) < 0.05 * float(jnp.abs(ref).max())
    assert float(jnp.abs(ref - low).max()) > 0  # it really computed in bfloat16


@pytest.mark.parametrize("base", [GPT2, LLAMA], ids=["tied", "untied"])
def test_bfloat16_logits_are_accumulated_in_float32(base):
    """With bf16 compute the head's inputs are bf16, but the logits are their float32 product, not a
    bf16-rounded one (bf16 keeps 8 bits: rounding would show up at ~1e-3 relative)."""
    from transformer.models.decoder import output_logits
    cfg = base.replace(dtype="bfloat16")
    tok = _tokens(7)
    params = _init(base, tok)[1]
    model = DecoderLM(cfg)
    logits = model.apply(params, tok)
    hidden_BTD = model.apply(params, tok, return_hidden=True)
    assert logits.dtype == jnp.float32 and hidden_BTD.dtype == jnp.bfloat16
    p = params["params"]
    W_DV = (p["token_embedding"]["embedding"].T if base.tie_embeddings else p["head"]["kernel"])
    W_DV = W_DV.astype(jnp.bfloat16).astype(jnp.float32)
    expected = jnp.einsum("btd,dv->btv", hidden_BTD.astype(jnp.float32), W_DV, precision="highest")
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(output_logits(cfg, p, hidden_BTD), expected, rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(expected - expected.astype(jnp.bfloat16).astype(jnp.float32)).max()) > 1e-4


def test_post_ln_normalises_block_output_and_pre_ln_does_not():
    x = jax.random.normal(jax.random.PRNGKey(0), (2, T, 32)) * 4 + 2
    outs = {}
    for position in ("pre", "post"):
        block = TransformerBlock(GPT2.replace(norm_position=position), causal=True)
        p = block.init(jax.random.PRNGKey(1), x)
        outs[position] = block.apply(p, x)
    np.testing.assert_allclose(outs["post"].std(-1), 1.0, atol=1e-3)
    np.testing.assert_allclose(outs["post"].mean(-1), 0.0, atol=1e-4)
    assert float(jnp.abs(outs["pre"].std(-1) - 1.0).min()) > 0.5
    tok = _tokens()
    post_model, post_params = _init(GPT2.replace(norm_position="post"), tok)
    assert "final_norm" not in post_params["params"]
    pre_model, pre_params = _init(GPT2, tok)
    shared = {k: v for k, v in pre_params["params"].items() if k != "final_norm"}
    assert float(jnp.abs(post_model.apply({"params": shared}, tok) - pre_model.apply(pre_params, tok)).max()) > 1e-3


def test_dropout_only_when_not_deterministic():
    """deterministic (the default: evaluation, decoding) is exactly the model without dropout, whatever rng is
    given; not deterministic, dropout changes the output, differently per rng and reproducibly for one rng."""
    cfg = GPT2.replace(dropout_rate=0.5)
    tok = _tokens()
    model, params = _init(cfg, tok)
    without = np.asarray(DecoderLM(GPT2).apply(params, tok))  # dropout has no parameters: the same tree
    np.testing.assert_array_equal(model.apply(params, tok), without)
    np.testing.assert_array_equal(model.apply(params, tok, deterministic=True, rngs={"dropout": jax.random.PRNGKey(1)}),
                                  without)
    drop = functools.partial(model.apply, params, tok, deterministic=False)
    a = np.asarray(drop(rngs={"dropout": jax.random.PRNGKey(1)}))
    b = np.asarray(drop(rngs={"dropout": jax.random.PRNGKey(2)}))
    assert np.abs(a - without).max() > 1e-3 and np.abs(a - b).max() > 1e-3
    np.testing.assert_array_equal(drop(rngs={"dropout": jax.random.PRNGKey(1)}), a)


def test_sown_attention_weights():
    tok = _tokens()
    params = _init(LLAMA, tok)[1]
    logits, state = DecoderLM(LLAMA, sow_attention_weights=True).apply(params, tok, mutable=["intermediates"])
    weights = [w for path, w in jax.tree_util.tree_leaves_with_path(state["intermediates"])]
    assert len(weights) == LLAMA.num_layers and weights[0].shape == (2, 4, T, T)
    np.testing.assert_allclose(logits, DecoderLM(LLAMA).apply(params, tok), atol=1e-5)
    assert float(jnp.abs(jnp.triu(weights[0], 1)).max()) == 0.0


def test_build_model_dispatch():
    from transformer.models.encoder import EncoderModel
    from transformer.models.encoder_decoder import EncoderDecoderModel
    assert isinstance(build_model(GPT2), DecoderLM)
    assert isinstance(build_model(GPT2.replace(family="encoder")), EncoderModel)
    assert isinstance(build_model(GPT2.replace(family="encoder_decoder")), EncoderDecoderModel)
