"""DecoderLM: causality, packing, decoding cache, scan/remat equivalence, sharding names, dtypes."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.core import unfreeze

from cheap_init import init_variables
from configs.common import DEFAULT_RULES
from transformer.models import build_model
from transformer.models.blocks import LAYERS_AXIS, TransformerBlock
from transformer.spec import ModelConfig
from transformer.inference.generate import empty_cache
from transformer.models.decoder import DecoderLM

SMALL = dict(vocab_size=50, d_model=32, num_layers=2, num_heads=4, d_ff=64, max_len=32)
GPT2 = ModelConfig(**SMALL)  # learned positions, pre-LN LayerNorm, GELU, biases, tied head
LLAMA = ModelConfig(**SMALL, positional="rope", norm="rmsnorm", activation="swiglu", num_kv_heads=2,
                    tie_embeddings=False, use_bias=False)
T = 12


def _tokens(seed: int = 0, shape=(2, T)) -> jax.Array:
    return jax.random.randint(jax.random.PRNGKey(seed), shape, 1, 50)


@functools.lru_cache(maxsize=None)
def _init_cfg(cfg: ModelConfig):
    """(model, variables) of `cfg`, made once per config. Scanned layers: the unscanned model's parameters,
    stacked (test_scan_equals_unrolled checks that layout against the scanned model's own init), since an eager
    nn.scan is traced anew on every call."""
    model = DecoderLM(cfg)
    if cfg.scan_layers:
        unrolled = _init_cfg(cfg.replace(scan_layers=False))[1]
        return model, {"params": _restack(unfreeze(unrolled["params"]), cfg.num_layers)}
    return model, init_variables(model, jnp.ones((1, T), jnp.int32))


def _init(cfg: ModelConfig, tokens: jax.Array):
    """(model, variables), cached per config: tests share the parameters of the same config (which do not
    depend on the shape of `tokens`)."""
    return _init_cfg(cfg)


@functools.lru_cache(maxsize=None)
def _jit(model: nn.Module, **static):
    """`model.apply` with keyword settings `static`, compiled (once per model, settings and input shapes):
    an eager flax apply dispatches op by op, each new shape compiling its own kernels."""
    return jax.jit(functools.partial(model.apply, **static))


@pytest.mark.parametrize("impl", ["einsum", "chunked"])
@pytest.mark.parametrize("base", [GPT2, LLAMA], ids=["gpt2", "llama"])
def test_causal(base, impl):
    tok = _tokens()
    params = _init(base, tok)[1]
    model = DecoderLM(base.replace(attention_impl=impl))
    logits = _jit(model)(params, tok)
    assert logits.dtype == jnp.float32 and logits.shape == (2, T, 50)
    t = 5
    changed = tok.at[:, t + 1:].set((tok[:, t + 1:] + 7) % 50)
    logits2 = _jit(model)(params, changed)
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
    logits = _jit(model)(params, tok, pos, seg)
    changed = tok.at[:, n1:].set((tok[:, n1:] + 3) % 50)
    logits2 = _jit(model)(params, changed, pos, seg)
    np.testing.assert_allclose(logits[:, :n1], logits2[:, :n1], atol=1e-5)
    alone = _jit(model)(params, tok[:, n1:n1 + n2])  # segment 2 as its own sequence, positions from 0
    np.testing.assert_allclose(logits[:, n1:n1 + n2], alone, atol=1e-5)


def test_sliding_window_limits_receptive_field():
    cfg = LLAMA.replace(num_layers=1, sliding_window=3)
    tok = _tokens(2)
    model, params = _init(cfg, tok)
    changed = tok.at[:, 0].set((tok[:, 0] + 1) % 50)
    a, b = _jit(model)(params, tok), _jit(model)(params, changed)
    np.testing.assert_allclose(a[:, 3:], b[:, 3:], atol=1e-5)  # position 3 sees 1..3 only
    assert float(jnp.abs(a[:, :3] - b[:, :3]).max()) > 1e-4


@pytest.mark.parametrize("base", [GPT2, LLAMA.replace(scan_layers=True, sliding_window=5)],
                         ids=["gpt2", "llama_scan_window"])
def test_kv_cache_decoding_matches_full_forward(base):
    tok = _tokens(3, (2, T))
    model, params = _init(base, tok)
    full = jax.jit(model.apply)(params, tok)
    cache = empty_cache(model, (tok,))  # generate's zero cache (shapes from model.init, nothing compiled)
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


@pytest.mark.parametrize("cfg", [pytest.param(GPT2, marks=pytest.mark.slow), GPT2.replace(scan_layers=True)],
                         ids=["layers", "scanned"])
def test_decoding_past_the_cache_is_an_error(cfg):
    """dynamic_update_slice clamps its start: without the check the 5th token would overwrite slot 3.
    Scanned layers are checked once by the stack, outside nn.scan (blocks.py)."""
    from transformer.layers.attention import CacheOverflowError
    tok = _tokens(3, (2, 4))
    model, params = _init(cfg, tok)
    cache = empty_cache(model, (tok,))  # 4 slots
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
    scanned_model = DecoderLM(base.replace(scan_layers=True))
    scanned_params = nn.unbox(jax.eval_shape(scanned_model.init, jax.random.PRNGKey(0), tok))  # its own layout
    restacked = _restack(unfreeze(params["params"]), base.num_layers)
    assert jax.tree.map(jnp.shape, restacked) == jax.tree.map(jnp.shape, scanned_params["params"])
    np.testing.assert_allclose(jax.jit(scanned_model.apply)({"params": restacked}, tok),
                               jax.jit(model.apply)(params, tok), atol=1e-5)


def _first_token_loss(model: DecoderLM, params, tok: jax.Array) -> jax.Array:
    return jnp.mean(jax.nn.log_softmax(model.apply(params, tok))[..., 0])


@functools.lru_cache(maxsize=None)
def _llama_grads_without_remat():
    """The reference of every remat policy below, compiled once."""
    tok = _tokens(5)
    model, params = _init(LLAMA, tok)
    return jax.jit(jax.grad(lambda p: _first_token_loss(model, p, tok)))(params)


@pytest.mark.parametrize("remat", ["full", "dots", "dots_no_batch"])
def test_remat_gives_same_gradients(remat):
    tok = _tokens(5)
    params = _init(LLAMA, tok)[1]
    remat_model = DecoderLM(LLAMA.replace(remat=remat, scan_layers=remat == "dots"))
    remat_params = params if remat != "dots" else {"params": _restack(unfreeze(params["params"]), 2)}
    g = _llama_grads_without_remat()
    g_remat = jax.jit(jax.grad(lambda p: _first_token_loss(remat_model, p, tok)))(remat_params)
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
    ref, low = _jit(model)(params, tok), _jit(bf16)(params, tok)
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
    logits = _jit(model)(params, tok)
    hidden_BTD = _jit(model, return_hidden=True)(params, tok)
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
        outs[position] = _jit(block)(init_variables(block, x, seed=1), x)
    np.testing.assert_allclose(outs["post"].std(-1), 1.0, atol=1e-3)
    np.testing.assert_allclose(outs["post"].mean(-1), 0.0, atol=1e-4)
    assert float(jnp.abs(outs["pre"].std(-1) - 1.0).min()) > 0.5
    tok = _tokens()
    post_model, post_params = _init(GPT2.replace(norm_position="post"), tok)
    assert "final_norm" not in post_params["params"]
    pre_model, pre_params = _init(GPT2, tok)
    shared = {k: v for k, v in pre_params["params"].items() if k != "final_norm"}
    assert float(jnp.abs(_jit(post_model)({"params": shared}, tok) - _jit(pre_model)(pre_params, tok)).max()) > 1e-3


def test_dropout_only_when_not_deterministic():
    """deterministic (the default: evaluation, decoding) is exactly the model without dropout, whatever rng is
    given; not deterministic, dropout changes the output, differently per rng and reproducibly for one rng."""
    cfg = GPT2.replace(dropout_rate=0.5)
    tok = _tokens()
    model, params = _init(cfg, tok)
    without = np.asarray(_jit(DecoderLM(GPT2))(params, tok))  # dropout has no parameters: the same tree
    np.testing.assert_array_equal(_jit(model)(params, tok), without)
    np.testing.assert_array_equal(_jit(model, deterministic=True)(params, tok, rngs={"dropout": jax.random.PRNGKey(1)}),
                                  without)
    drop = functools.partial(_jit(model, deterministic=False), params, tok)
    a = np.asarray(drop(rngs={"dropout": jax.random.PRNGKey(1)}))
    b = np.asarray(drop(rngs={"dropout": jax.random.PRNGKey(2)}))
    assert np.abs(a - without).max() > 1e-3 and np.abs(a - b).max() > 1e-3
    np.testing.assert_array_equal(drop(rngs={"dropout": jax.random.PRNGKey(1)}), a)


def test_sown_attention_weights():
    tok = _tokens()
    params = _init(LLAMA, tok)[1]
    logits, state = _jit(DecoderLM(LLAMA, sow_attention_weights=True), mutable=("intermediates",))(params, tok)
    weights = [w for path, w in jax.tree_util.tree_leaves_with_path(state["intermediates"])]
    assert len(weights) == LLAMA.num_layers and weights[0].shape == (2, 4, T, T)
    np.testing.assert_allclose(logits, _jit(DecoderLM(LLAMA))(params, tok), atol=1e-5)
    assert float(jnp.abs(jnp.triu(weights[0], 1)).max()) == 0.0


def test_build_model_dispatch():
    from transformer.models.encoder import EncoderModel
    from transformer.models.encoder_decoder import EncoderDecoderModel
    assert isinstance(build_model(GPT2), DecoderLM)
    assert isinstance(build_model(GPT2.replace(family="encoder")), EncoderModel)
    assert isinstance(build_model(GPT2.replace(family="encoder_decoder")), EncoderDecoderModel)
