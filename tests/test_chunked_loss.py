"""The chunked cross-entropy (train.loss_chunk_size) equals the plain one: loss, gradients, a train step."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cheap_init import init_variables
from configs import lm
from transformer.models import build_model
from transformer.spec import ConfigError
from transformer.tasks import get_task
from transformer.training import losses, sharding, steps
from transformer.training.resolve import model_config
from transformer.training.optimizer import make_optimizer
from transformer.training.state import TrainState, abstract_state

T = 32


@functools.lru_cache(maxsize=None)
def _setup(preset: str):
    """(config, model, task, params, batch) of a preset, made once: the tests share them."""
    c = lm.get_config(preset)
    c.data.seq_len, c.train.batch_size, c.train.warmup_steps = T, 4, 0
    c.mesh.data = 1
    cfg = model_config(c, 259)
    model, task = build_model(cfg), get_task(c)
    params = init_variables(model, np.zeros((1, T), np.int32))["params"]
    rng = np.random.default_rng(0)
    seg = np.ones((4, T), np.int32)
    seg[:, T // 2:] = 2
    weights = np.ones((4, T), np.float32)
    weights[:, T // 2 - 1] = 0.0
    weights[0, -5:] = 0.0
    batch = {"inputs": rng.integers(0, 259, (4, T)).astype(np.int32),
             "targets": rng.integers(0, 259, (4, T)).astype(np.int32), "segment_ids": seg,
             "positions": np.concatenate([np.arange(T // 2)] * 2)[None].repeat(4, 0).astype(np.int32),
             "weights": weights}
    return c, model, task, params, batch


@functools.lru_cache(maxsize=None)
def _plain_loss_and_grads(preset: str):
    """The plain cross-entropy's loss and gradients: the reference of every chunk size, compiled once."""
    _, model, task, params, batch = _setup(preset)

    def plain(p):
        logits, t, w = task.forward(model, p, batch, deterministic=True, rngs=None)
        s, n = losses.cross_entropy(logits, t, w)
        return s / n

    return jax.jit(jax.value_and_grad(plain))(params)


@pytest.mark.parametrize("preset", ["gpt2_tiny", "llama_tiny"])  # tied and untied heads
@pytest.mark.parametrize("chunk", [8, 32])
def test_chunked_equals_plain_loss_and_grads(preset, chunk):
    _, model, task, params, batch = _setup(preset)

    def chunked(p):
        h, logits_fn, t, w = task.forward_hidden(model, p, batch, deterministic=True, rngs=None)
        s, n = losses.chunked_cross_entropy(h, logits_fn, t, w, chunk)
        return s / n

    loss_a, grads_a = _plain_loss_and_grads(preset)
    loss_b, grads_b = jax.jit(jax.value_and_grad(chunked))(params)
    assert float(loss_b) == pytest.approx(float(loss_a), rel=1e-6)
    assert float(loss_a) > 5.0  # untrained over 259 tokens: about ln(259) = 5.56
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads_a), jax.tree.leaves(grads_b)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-7,
                                   err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow  # CI's 15 minutes: 24 s of the default run on 2 loaded cores (2026-11-27)
def test_train_step_with_chunked_loss_matches():
    c, model, task, params, batch = _setup("gpt2_tiny")
    tx = make_optimizer(c.train)
    mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
    rules = sharding.rules(c.mesh)
    _, shardings = abstract_state(model, tx, task.init_inputs(c), mesh, rules)
    # both steps start from the shared parameters, put on the device from a host copy (the step donates its state)
    initial = jax.device_get(TrainState(step=np.zeros((), np.int32), params=params, opt_state=tx.init(params)))
    results = []
    for chunk in (0, 16):
        state = jax.device_put(initial, shardings)
        train_fn, _ = steps.jit_steps(steps.make_train_step(model, task, tx, seed=0, use_dropout=False,
                                                            loss_chunk_size=chunk),
                                      steps.make_eval_step(model, task), shardings, mesh, rules)
        with jax.set_mesh(mesh):
            state, metrics = train_fn(state, jax.tree.map(jnp.asarray, batch))
        results.append((float(metrics["loss"]), jax.device_get(state.params)))
    assert results[1][0] == pytest.approx(results[0][0], rel=1e-6)
    for a, b in zip(jax.tree.leaves(results[0][1]), jax.tree.leaves(results[1][1])):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_chunk_must_divide_sequence():
    h = jnp.zeros((2, 10, 4))
    with pytest.raises(ConfigError, match="loss_chunk_size"):
        losses.chunked_cross_entropy(h, lambda x: x, jnp.zeros((2, 10), jnp.int32), jnp.ones((2, 10)), 3)
