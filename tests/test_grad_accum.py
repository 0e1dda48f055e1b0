"""Gradient accumulation (train.grad_accum_steps): k micro-batches per update give the full batch's updates.

The reference is the un-accumulated step (one forward and backward pass over the whole batch), an independent
route; the batches give their micro-batches different numbers of target tokens, so a mean of micro-batch means
would fail. Also: on 8 devices, in a vmapped group, the settings' checks, the sweep's choice, lower peak memory.
"""
from __future__ import annotations

import copy
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict

from configs import lm
from transformer.models import build_model
from transformer.spec import ConfigError, MeshSpec, RunSpec, TrainSpec
from transformer.tasks import get_task
from transformer.training import multirun, sharding, steps
from transformer.training.optimizer import make_optimizer, with_peak_lrs
from transformer.training.resolve import model_config
from transformer.training.state import TrainState, abstract_state, init_state

T, B, V = 32, 8, 259  # T >= the largest batch: row r of any batch masks its own count of tokens


def _setup(batch_size: int = B, mesh_data: int = 1):
    c = lm.get_config("gpt2_tiny")
    c.data.seq_len, c.train.batch_size, c.train.warmup_steps = T, batch_size, 0
    c.train.learning_rate = 3e-3
    c.model.num_layers = 1  # one block shows accumulation as well as two, at half the compilation time
    c.mesh.data = mesh_data
    cfg = model_config(c, V)
    return c, build_model(cfg), get_task(c)


def _batches(n: int, batch_size: int = B, seed: int = 0) -> list[dict]:
    """n LM batches whose rows hold very different numbers of target tokens (row r: r·T/B of them masked)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        weights = np.ones((batch_size, T), np.float32)
        for r in range(batch_size):
            weights[r, : (r * T) // batch_size] = 0.0  # micro-batch i (rows i, k+i, ...) gets its own count
        out.append({"inputs": rng.integers(0, V, (batch_size, T)).astype(np.int32),
                    "targets": rng.integers(0, V, (batch_size, T)).astype(np.int32),
                    "segment_ids": np.ones((batch_size, T), np.int32),
                    "positions": np.arange(T, dtype=np.int32)[None].repeat(batch_size, 0), "weights": weights})
    return out


@functools.lru_cache(maxsize=None)
def _initial_state() -> TrainState:
    """gpt2_tiny's initial train state (seed 0) on the host, made once: every run of these tests starts from it
    (its initialisation is a compilation of its own, as costly as a train step's)."""
    c, model, task = _setup()
    mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
    return jax.device_get(init_state(model, make_optimizer(c.train), 0, task.init_inputs(c), mesh,
                                     sharding.rules(c.mesh))[0])


@functools.lru_cache(maxsize=None)
def _step(k: int, n_devices: int = 1, runs: int = 0):
    """(jitted train step of k micro-batches per update, its mesh, rules, state shardings), on the first
    n_devices devices (mesh.data = n_devices), vmapped over `runs` runs if runs > 0: built once per setting,
    so a test that lowers the step a run has called reuses its compilation."""
    c, model, task = _setup(mesh_data=n_devices)
    tx = make_optimizer(c.train)
    mesh, rules = sharding.make_mesh(c.mesh, jax.devices()[:n_devices]), sharding.rules(c.mesh)
    _, shardings = abstract_state(model, tx, task.init_inputs(c), mesh, rules)
    train_fn, _ = steps.jit_steps(steps.make_train_step(model, task, tx, seed=0, use_dropout=False,
                                                        grad_accum_steps=k),
                                  steps.make_eval_step(model, task), shardings, mesh, rules, runs=runs)
    return train_fn, mesh, rules, shardings


def _train(k: int, batches: list[dict], n_devices: int = 1, runs: int = 0):
    """Losses of each step and the final parameters, training `batches` with k micro-batches per update."""
    train_fn, mesh, rules, shardings = _step(k, n_devices, runs)
    state = jax.device_put(_initial_state(), shardings)
    if runs:
        state = multirun.stack([state] * runs)
        state = state.replace(opt_state=with_peak_lrs(state.opt_state, [3e-3, 1e-3][:runs]))
    losses = []
    with jax.set_mesh(mesh):
        for batch in batches:
            b = {key: np.stack([v] * runs) if runs else v for key, v in batch.items()}
            batch_s = sharding.batch_sharding(mesh, rules)
            state, metrics = train_fn(state, jax.device_put(b, multirun.with_run_axis(batch_s) if runs else batch_s))
            losses.append(np.asarray(metrics["loss"]))
    return np.array(losses), jax.device_get(state.params)


@functools.lru_cache(maxsize=None)
def _full_batch_run():
    """Two un-accumulated updates of 32 rows on one device: the reference of the accumulated runs below."""
    return _train(1, _batches(2, batch_size=32))


def _flat(tree) -> np.ndarray:
    return np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(tree)])


def _assert_same(a, b, rtol=1e-5):
    """Losses of every step within rtol, and the final parameters within rtol in norm over the whole model.
    (Not leaf by leaf: Adam divides each gradient by its own magnitude, so a leaf whose gradient is zero up to
    rounding, e.g. an attention key's bias, moves by rounding noise scaled to the learning rate.)"""
    (loss_a, params_a), (loss_b, params_b) = a, b
    np.testing.assert_allclose(loss_b, loss_a, rtol=rtol)
    x, y = _flat(params_a), _flat(params_b)
    assert np.linalg.norm(y - x) <= rtol * np.linalg.norm(x), np.linalg.norm(y - x) / np.linalg.norm(x)


@pytest.mark.slow  # CI's 15 minutes: 20 s of the default run on 2 loaded cores (2026-11-27)
def test_accumulated_loss_and_gradients_equal_the_full_batch_ones():
    _, model, task = _setup()
    batch = jax.tree.map(jnp.asarray, _batches(1)[0])
    params = _initial_state().params
    out = {k: jax.jit(steps.make_value_and_grad(model, task, seed=0, use_dropout=False, grad_accum_steps=k))(
        params, batch, jnp.int32(0)) for k in (1, 4)}
    (loss_1, tokens_1), grads_1 = out[1]
    (loss_4, tokens_4), grads_4 = out[4]
    assert float(tokens_4) == float(tokens_1) == float(np.sum(batch["weights"]))
    assert float(loss_4) == pytest.approx(float(loss_1), rel=1e-6)  # the token mean over the whole batch ...
    micro_loss = jax.jit(steps.make_loss_fn(model, task, seed=0, use_dropout=False))
    means = [float(micro_loss(params, {k: v[i::4] for k, v in batch.items()}, jnp.int32(0))[0]) for i in range(4)]
    assert abs(np.mean(means) - float(loss_1)) > 1e-4  # ... not the mean of micro-batch means, which differs here
    floor = 1e-3 * np.linalg.norm(_flat(grads_1))  # a leaf with a zero gradient (the key bias) is rounding only
    for (path, g1), g4 in zip(jax.tree_util.tree_leaves_with_path(grads_1), jax.tree.leaves(grads_4)):
        diff = np.linalg.norm(np.asarray(g4) - np.asarray(g1))
        assert diff <= 1e-5 * max(np.linalg.norm(np.asarray(g1)), floor), jax.tree_util.keystr(path)


def test_accumulated_updates_equal_the_full_batch_update():
    full = _full_batch_run()
    _assert_same(full, _train(4, _batches(2, batch_size=32)))
    assert not np.allclose(full[0][1:], full[0][0])  # the parameters moved: the steps differ


def test_accumulation_on_eight_devices_equals_one_device():
    _assert_same(_full_batch_run(), _train(2, _batches(2, batch_size=32), n_devices=8))


@pytest.mark.slow  # CI's time (the default run is at its 15 minutes); -m slow runs it
def test_accumulation_in_a_vmapped_group():
    batches = _batches(2)
    _assert_same(_train(1, batches, runs=2), _train(4, batches, runs=2))


def test_settings_are_checked():
    with pytest.raises(ConfigError, match=r"train.grad_accum_steps=3 must divide train.batch_size=8.*1, 2, 4, 8"):
        TrainSpec(batch_size=8, grad_accum_steps=3)
    with pytest.raises(ConfigError, match="train.grad_accum_steps=0 must be a positive integer"):
        TrainSpec(grad_accum_steps=0)
    c, _, _ = _setup(batch_size=16)
    model_cfg = model_config(c, V)
    mesh = MeshSpec.from_config(ConfigDict({"data": 4, "fsdp": 1, "tensor": 1, "rules": c.mesh.rules}), 4)
    RunSpec(model=model_cfg, train=TrainSpec(batch_size=16, grad_accum_steps=4), mesh=mesh, seq_len=T)
    with pytest.raises(ConfigError, match=r"micro-batch of train.batch_size/8=2 rows must split over the "
                                          r"data-parallel size 4"):
        RunSpec(model=model_cfg, train=TrainSpec(batch_size=16, grad_accum_steps=8), mesh=mesh, seq_len=T)


def test_a_sweep_accumulates_the_batches_above_its_micro_batch_size():
    from transformer.design import grid
    from transformer.design.spec import SweepSpec

    base = lm.get_config("gpt2_tiny").to_dict()
    s = dict(budgets=(1e11, 2e11, 4e11), micro_batch_size=16, warmup_tokens_per_param=0.0, warmup_fraction=0.1,
             warmup_min=1, evals_per_run=1, checkpoints_per_run=1, logs_per_run=1, d_models=(64,))
    sweep = SweepSpec.from_settings(s, base)
    assert [grid.grad_accum_for(sweep, b) for b in (8, 16, 24, 64, 96)] == [1, 1, 2, 4, 6]
    shape = grid.Shape(d_model=64, num_layers=2, num_heads=2, head_dim=32, d_ff=256)
    cfg = grid.run_config(base, sweep, shape, V, steps=10, batch_size=64)
    assert (cfg["train"]["batch_size"], cfg["train"]["grad_accum_steps"]) == (64, 4)
    TrainSpec.from_config(cfg["train"])  # a valid setting
    plain = grid.run_config(base, SweepSpec.from_settings({**s, "micro_batch_size": 0}, base), shape, V, steps=10,
                            batch_size=64)
    assert plain["train"]["grad_accum_steps"] == 1
    assert grid.run_id("x", plain) == grid.run_id("x", _without_accum(plain))  # k = 1 keeps the earlier ids
    assert grid.run_id("x", cfg) != grid.run_id("x", plain)


def _without_accum(cfg: dict) -> dict:
    """The config as it was before train.grad_accum_steps existed: the same run id as k = 1."""
    d = copy.deepcopy(cfg)
    d["train"].pop("grad_accum_steps")
    return d


@pytest.mark.slow  # CI's time (the default run is at its 15 minutes); -m slow runs it
def test_accumulation_lowers_peak_memory():
    """XLA's memory analysis of the compiled step: the temporaries (activations) shrink with k. (The steps of
    the 32-row runs above: lowering them again reuses their compilations.)"""
    batch = jax.tree.map(jnp.asarray, _batches(1, batch_size=32)[0])
    temp = {}
    for k in (1, 4):
        fn, mesh, _, shardings = _step(k)
        with jax.set_mesh(mesh):
            state = jax.device_put(_initial_state(), shardings)
            temp[k] = fn.lower(state, batch).compile().memory_analysis().temp_size_in_bytes
    assert temp[4] < 0.6 * temp[1], temp


@pytest.mark.slow
def test_a_run_trains_with_accumulation_and_resumes_with_another_k(corpus_dir, tmp_path):
    """Through the loop: k = 2 logs the losses of k = 1; a finished k = 1 run reopened with k = 2 is the same run
    (the setting says how an update is computed, not which: an out-of-memory run may resume with a larger k)."""
    import json

    from transformer.training.loop import train

    def config(k: int):
        c = lm.get_config("gpt2_tiny")
        c.data.data_dir, c.data.seq_len = corpus_dir, 32
        c.train.update(steps=3, warmup_steps=1, batch_size=16, eval_every=3, eval_steps=1, checkpoint_every=3,
                       log_every=1, grad_accum_steps=k)
        return c

    losses = {}
    for k in (1, 2):
        summary = train(config(k), str(tmp_path / f"k{k}"), verbose=False)
        assert summary["status"] == "ok"
        with open(tmp_path / f"k{k}" / "metrics.jsonl") as f:
            losses[k] = [r["train_loss"] for r in map(json.loads, f) if "train_loss" in r]
    assert len(losses[1]) == 3
    np.testing.assert_allclose(losses[2], losses[1], rtol=1e-5)
    again = train(config(2), str(tmp_path / "k1"), verbose=False)  # recorded with k = 1: not "a different run"
    assert again["status"] == "ok" and again["train_loss"] == pytest.approx(losses[1][-1], rel=1e-6)


def test_a_workdir_resumes_with_another_k_and_from_before_the_key(tmp_path):
    import json

    from transformer.training.run_io import check_workdir_config

    recorded = {"model": {"d_model": 64}, "train": {"steps": 10, "batch_size": 16}, "data": {}}
    (tmp_path / "config.json").write_text(json.dumps(recorded))  # written before train.grad_accum_steps existed
    for k in (1, 4):
        assert check_workdir_config(str(tmp_path), {**recorded, "train": {**recorded["train"],
                                                                          "grad_accum_steps": k}}) is None
    with pytest.raises(ConfigError, match="differs in train.batch_size"):
        check_workdir_config(str(tmp_path), {**recorded, "train": {"steps": 10, "batch_size": 32}})
