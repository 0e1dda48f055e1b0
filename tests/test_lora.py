"""LoRA (model.lora): the adapter's formula, a fresh adapter changing nothing, the optimizer holding no state for
the frozen base and moving only the adapters, the accounting of what trains, the refusals."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import lm
from transformer.layers import lora
from transformer.layers.projection import Projection
from transformer.models import build_model
from transformer.spec import ConfigError, LoraSpec, ModelConfig, flops_per_token, matmul_params, param_counts
from transformer.spec.lora import LORA_TARGETS
from transformer.training import steps
from transformer.training.state import model_optimizer

ALL = ",".join(LORA_TARGETS)


def _cfg(family: str, **kw) -> ModelConfig:
    base = dict(family=family, d_model=32, num_heads=4, num_kv_heads=2, d_ff=48, num_layers=2, vocab_size=128,
                attention_impl="einsum", lora=LoraSpec(rank=4, alpha=8.0, targets=ALL))
    return ModelConfig(**{**base, **kw})


def _inputs(cfg: ModelConfig) -> tuple:
    tokens = jnp.asarray(np.random.default_rng(0).integers(3, cfg.vocab_size, (2, 6)), jnp.int32)
    return (tokens, tokens) if cfg.family == "encoder_decoder" else (tokens,)


def _perturb_b(params, seed=1):
    """Every lora_b set to random values (a fresh adapter's is zero)."""
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map_with_path(
        lambda p, x: jnp.asarray(rng.normal(0, 0.1, x.shape), x.dtype) if p[-1].key == "lora_b" else x, params)


@pytest.mark.parametrize("equation,shape,names", [
    ("btd,dnh->btnh", (8, 3, 5), ("embed", "heads", "head_dim")),      # query
    ("btnh,nhd->btd", (3, 5, 8), ("heads", "head_dim", "embed")),      # out
    ("btd,df->btf", (8, 12), ("embed", "mlp"))])                        # mlp_in
def test_adapter_is_x_w_plus_scaled_x_a_b(equation, shape, names):
    spec = LoraSpec(rank=2, alpha=6.0, targets="query")
    proj = Projection(equation, shape, names, bias_names=None, init_std=0.5, dtype=jnp.float32,
                      param_dtype=jnp.float32, lora=spec)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 4, *shape[:len(shape) - (2 if len(shape) == 3 and
                                                                                   names[0] == "embed" else 1)])),
                    jnp.float32)
    params = _perturb_b(nn.unbox(proj.init(jax.random.PRNGKey(0), x)["params"]))
    assert params["lora_a"].shape[-1] == 2 and params["lora_b"].shape[0] == 2
    y = np.asarray(proj.apply({"params": params}, x))
    n_in = params["lora_a"].ndim - 1
    xa = np.tensordot(np.asarray(x), params["lora_a"], axes=(list(range(2, 2 + n_in)), list(range(n_in))))
    want = (np.tensordot(np.asarray(x), params["kernel"], axes=(list(range(2, 2 + n_in)), list(range(n_in))))
            + 3.0 * np.tensordot(xa, params["lora_b"], axes=([2], [0])))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    merged = lora.merged_kernel(params["kernel"], params["lora_a"], params["lora_b"], spec.scaling)
    plain = Projection(equation, shape, names, bias_names=None, init_std=0.5, dtype=jnp.float32,
                       param_dtype=jnp.float32)
    np.testing.assert_allclose(plain.apply({"params": {"kernel": merged}}, x), y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", [pytest.param("decoder", marks=pytest.mark.slow), "encoder", "encoder_decoder"])  # CI's 15 minutes (2026-11-27): 23 s
def test_fresh_adapters_change_nothing_and_trained_ones_do(family):
    cfg = _cfg(family)
    base = build_model(cfg.replace(lora=LoraSpec()))
    adapted = build_model(cfg)
    params = nn.unbox(adapted.init(jax.random.PRNGKey(0), *_inputs(cfg))["params"])
    paths = ["/".join(k.key for k in p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    # every targeted projection of every layer (cross-attention too) carries an adapter
    expected = {"query", "key", "value", "out", "wi", "wo"}
    adapted_modules = {p.split("/")[-2] for p in paths if p.endswith("lora_a")}
    assert adapted_modules == expected
    if family == "encoder_decoder":
        assert any("cross_attention/query/lora_b" in p for p in paths)
    base_params = jax.tree_util.tree_map_with_path(lambda p, x: x, params)
    base_params = _strip_adapters(base_params)
    ref = base.apply({"params": base_params}, *_inputs(cfg))
    np.testing.assert_array_equal(adapted.apply({"params": params}, *_inputs(cfg)), ref)
    moved = adapted.apply({"params": _perturb_b(params)}, *_inputs(cfg))
    assert np.abs(np.asarray(moved) - np.asarray(ref)).max() > 1e-3


def _strip_adapters(tree):
    if not isinstance(tree, dict):
        return tree
    return {k: _strip_adapters(v) for k, v in tree.items() if k not in ("lora_a", "lora_b")}


def test_targets_select_the_projections():
    cfg = _cfg("decoder", lora=LoraSpec(rank=2, targets="value,mlp_out"), activation="swiglu")
    params = jax.eval_shape(lambda r: build_model(cfg).init(r, *_inputs(cfg)), jax.random.PRNGKey(0))["params"]
    paths = {"/".join(k.key for k in p) for p, _ in jax.tree_util.tree_leaves_with_path(nn.unbox(params))}
    assert {p.rsplit("/", 2)[-2] for p in paths if "lora" in p} == {"value", "wo"}
    gated = _cfg("decoder", lora=LoraSpec(rank=2, targets="mlp_in"), activation="swiglu")
    params = jax.eval_shape(lambda r: build_model(gated).init(r, *_inputs(gated)), jax.random.PRNGKey(0))["params"]
    paths = {"/".join(k.key for k in p) for p, _ in jax.tree_util.tree_leaves_with_path(nn.unbox(params))}
    assert {p.rsplit("/", 2)[-2] for p in paths if "lora" in p} == {"wi_gate", "wi_up"}


@pytest.mark.parametrize("family,classes", [("decoder", 0), ("encoder", 3)])
def test_optimizer_holds_no_state_for_frozen_parameters_and_moves_only_adapters(family, classes):
    cfg = _cfg(family, num_classes=classes)
    model = build_model(cfg)
    c = lm.get_config("gpt2_tiny")
    c.train.update(dict(warmup_steps=0, learning_rate=1e-2, weight_decay=0.1, steps=10))
    inputs = _inputs(cfg)
    params = nn.unbox(model.init(jax.random.PRNGKey(0), *inputs)["params"])
    params = _perturb_b(params)
    tx = model_optimizer(model, c.train, inputs)
    opt_state = tx.init(params)
    mask = lora.trained_mask(cfg, params)
    trained = sum(x.size for x, t in zip(jax.tree.leaves(params), jax.tree.leaves(mask)) if t)
    frozen = sum(x.size for x, t in zip(jax.tree.leaves(params), jax.tree.leaves(mask)) if not t)
    assert trained == param_counts(cfg)["trainable"] and frozen > 10 * trained
    # Adam's two moments for the trained leaves, a step count, the peak rate: nothing of the frozen ones
    state_sizes = [x.size for x in jax.tree.leaves(opt_state)]
    assert sum(s for s in state_sizes if s > 1) == 2 * trained, state_sizes
    # the same in the run's sharded state, built from model.init's logically named boxes
    from transformer.training import sharding
    from transformer.training.state import abstract_state
    mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
    abstract, _ = abstract_state(model, tx, inputs, mesh, sharding.rules(c.mesh))
    assert sum(x.size for x in jax.tree.leaves(abstract.opt_state) if x.size > 1) == 2 * trained
    # one train step: the frozen leaves do not move (and have zero gradient), the adapters do
    from transformer.tasks import get_task
    task = get_task(_task_config(family, classes))
    batch = _batch(cfg, classes)
    step = steps.make_train_step(model, task, tx, seed=0, use_dropout=False)
    state0 = _state(params, opt_state)
    state1, metrics = jax.jit(step)(state0, batch)
    for (path, before), after, on in zip(jax.tree_util.tree_leaves_with_path(params),
                                         jax.tree.leaves(state1.params), jax.tree.leaves(mask)):
        moved = np.abs(np.asarray(after) - np.asarray(before)).max()
        assert (moved > 0) == on, (jax.tree_util.keystr(path), moved)
    frozen_modules = [m for m, v in metrics["rms"]["grads"].items() if "lora" not in m and float(v) != 0.0]
    assert all(m.split("/")[0] in ("pooler", "classifier") or m.endswith(("query", "key", "value", "out", "wi", "wo"))
               for m in frozen_modules), frozen_modules


def _task_config(family: str, classes: int):
    import types
    task = "classify" if classes else ("lm" if family == "decoder" else "mlm")
    return types.SimpleNamespace(train=types.SimpleNamespace(task=task), model=types.SimpleNamespace(family=family))


def _batch(cfg: ModelConfig, classes: int) -> dict:
    rng = np.random.default_rng(1)
    tokens = rng.integers(3, cfg.vocab_size, (2, 7)).astype(np.int32)
    if cfg.family == "decoder":
        return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "segment_ids": np.ones((2, 6), np.int32),
                "positions": np.tile(np.arange(6, dtype=np.int32), (2, 1)), "weights": np.ones((2, 6), np.float32)}
    return {"inputs": tokens[:, :-1], "segment_ids": np.ones((2, 6), np.int32), "labels": np.array([[0], [2]], np.int32),
            "weights": np.ones((2, 1), np.float32), "positions": np.tile(np.arange(6, dtype=np.int32), (2, 1))}


def _state(params, opt_state):
    from transformer.training.state import TrainState
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state)


def test_accounting_says_what_trains():
    cfg = _cfg("decoder", num_kv_heads=0)
    plain = cfg.replace(lora=LoraSpec())
    D, N, H, F, r, L = 32, 4, 8, 48, 4, 2
    per_layer = r * ((D + N * H) * 4 + (D + F) * 2)
    assert param_counts(cfg)["trainable"] == L * per_layer
    assert param_counts(cfg)["total"] == param_counts(plain)["total"] + L * per_layer
    assert matmul_params(cfg) == matmul_params(plain) + L * per_layer  # the adapters are matmuls too
    f = flops_per_token(cfg, 16)
    # the backward pass takes no gradient of a frozen weight: 2 FLOPs per frozen weight and token less
    assert f["with_attention"] - f["training"] == pytest.approx(2.0 * matmul_params(plain))
    assert flops_per_token(plain, 16)["training"] == flops_per_token(plain, 16)["with_attention"]


def test_memory_estimate_counts_trained_parameters_only():
    from transformer.training.memory import estimate
    cfg = _cfg("decoder")
    full = estimate(cfg.replace(lora=LoraSpec()), batch_size=8, seq_len=16)
    adapted = estimate(cfg, batch_size=8, seq_len=16)
    assert adapted["optimizer"] == 2 * 4.0 * param_counts(cfg)["trainable"]
    assert adapted["grads"] == 4.0 * param_counts(cfg)["trainable"]
    assert adapted["params"] > full["params"] and adapted["optimizer"] < full["optimizer"] / 10


@pytest.mark.parametrize("settings,match", [
    (dict(rank=-1), "model.lora.rank=-1"),
    (dict(rank=2, targets="query,ffn"), "unknown: ffn"),
    (dict(rank=2, targets=""), "at least one"),
    (dict(rank=2, alpha=0), "model.lora.alpha=0"),
    (dict(rank=2, dropout=1.0), "model.lora.dropout=1.0"),
    (dict(rank=2, scale=3), "unknown model.lora setting"),
])
def test_bad_settings_are_named(settings, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig.from_dict({"lora": settings})


def test_lora_needs_a_model_to_adapt_and_sp():
    from transformer.spec import RunSpec
    c = lm.get_config("gpt2_tiny")
    c.model.lora.rank = 4
    c.model.vocab_size = 256
    with pytest.raises(ConfigError, match="train.init_from"):
        RunSpec.from_dict(c.to_dict())
    with pytest.raises(ConfigError, match="parametrization='mup'"):
        _cfg("decoder", parametrization="mup", mup_base_width=16)
