"""Runs trained at once (vmapped over a run axis) equal the same runs trained one by one."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import lm
from transformer.models import build_model
from transformer.tasks import get_task
from transformer.training import multirun, sharding, steps, validate
from transformer.training.optimizer import make_optimizer
from transformer.training.state import init_state

T, B, STEPS = 32, 4, 4
LRS = (1e-3, 3e-3, 1e-2)
SEEDS = (0, 1, 0)


def _setup():
    c = lm.get_config("gpt2_tiny")
    c.data.seq_len, c.train.batch_size = T, B
    c.train.update(dict(steps=STEPS, warmup_steps=2, schedule="cosine"))
    c.mesh.data = 1
    cfg = validate.model_config(c, 259)
    return c, build_model(cfg), get_task(c)


def _batches():
    rng = np.random.default_rng(0)
    out = []
    for _ in range(STEPS):
        tokens = rng.integers(0, 259, (B, T + 1)).astype(np.int32)
        out.append({"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "segment_ids": np.ones((B, T), np.int32),
                    "positions": np.arange(T, dtype=np.int32)[None].repeat(B, 0),
                    "weights": np.ones((B, T), np.float32)})
    return out


def _separate(c, model, task, lr: float, seed: int) -> list[float]:
    c = c.copy_and_resolve_references()
    c.train.learning_rate = lr
    tx = make_optimizer(c.train)
    mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
    rules = sharding.rules(c.mesh)
    state, shardings = init_state(model, tx, seed, task.init_inputs(c), mesh, rules)
    train_fn, _ = steps.jit_steps(steps.make_train_step(model, task, tx, seed=0, use_dropout=False),
                                  steps.make_eval_step(model, task), shardings, mesh, rules)
    losses = []
    with jax.set_mesh(mesh):
        for batch in _batches():
            state, m = train_fn(state, jax.tree.map(jnp.asarray, batch))
            losses.append(float(m["loss"]))
    return losses


def test_multirun_equals_separate_runs():
    c, model, task = _setup()
    tx = multirun.make_optimizer(c.train)
    states = multirun.init_states(model, tx, seeds=SEEDS, learning_rates=LRS, init_inputs=task.init_inputs(c))
    step = multirun.make_multi_train_step(model, task, tx)
    together = []
    for batch in _batches():
        states, m = step(states, multirun.stack_batch(batch, len(LRS)))
        assert m["loss"].shape == (len(LRS),)
        together.append(np.asarray(m["loss"]))
    together = np.stack(together, axis=1)  # (R, STEPS)
    for r, (lr, seed) in enumerate(zip(LRS, SEEDS)):
        np.testing.assert_allclose(together[r], _separate(c, model, task, lr, seed), rtol=2e-5)
    # the runs really differ: learning rates (runs 0, 2 share a seed) and seeds change the losses
    assert abs(together[0, -1] - together[2, -1]) > 1e-3
    assert abs(together[0, 0] - together[1, 0]) > 1e-4
    assert int(states.step[0]) == STEPS


def test_multi_eval_and_unstack():
    c, model, task = _setup()
    tx = multirun.make_optimizer(c.train)
    states = multirun.init_states(model, tx, seeds=(3, 4), learning_rates=(1e-3, 1e-3),
                                  init_inputs=task.init_inputs(c))
    batch = multirun.stack_batch(_batches()[0], 2)
    sums = multirun.make_multi_eval_step(model, task)(states.params, batch)
    one = steps.make_eval_step(model, task)(multirun.unstack(states.params, 1), _batches()[0])
    assert float(sums["loss_sum"][1]) == pytest.approx(float(one["loss_sum"]), rel=1e-5)
    assert float(sums["loss_sum"][0]) != pytest.approx(float(sums["loss_sum"][1]), rel=1e-4)


def test_mismatched_lengths():
    c, model, task = _setup()
    with pytest.raises(ValueError, match="learning rates"):
        multirun.init_states(model, multirun.make_optimizer(c.train), seeds=(0, 1), learning_rates=(1e-3,),
                             init_inputs=task.init_inputs(c))
