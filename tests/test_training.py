"""Training: sharded step equals one device; loss falls; resume equals no interruption; bad configs."""
from __future__ import annotations

import copy
import json
import math
import os
import shutil

import flax.linen as nn
import jax
import numpy as np
import pytest

from configs import lm
from transformer.data import make_lm_iterator, unigram_entropy
from transformer.models import build_model
from transformer.spec import ConfigError
from transformer.tasks import get_task
from transformer.training import checkpointing, sharding, steps
from transformer.training.resolve import model_config, run_spec
from transformer.training.loop import train
from transformer.training.optimizer import make_optimizer, make_schedule
from transformer.training.state import abstract_state, init_state
from cli_modules import cli_module


def tiny_config(tmp_data_dir: str, **train_overrides):
    c = lm.get_config("gpt2_tiny")
    c.data.data_dir = tmp_data_dir
    c.data.seq_len = 64
    c.train.update(dict(steps=20, batch_size=8, learning_rate=3e-3, warmup_steps=1, log_every=5,
                        eval_every=10, eval_steps=2, checkpoint_every=5))
    c.train.update(train_overrides)
    return c


def _synthetic_batch(rng: np.random.Generator, batch: int, seq: int, vocab: int) -> dict[str, np.ndarray]:
    tokens = rng.integers(3, vocab, size=(batch, seq + 1)).astype(np.int32)
    segment_ids = np.ones((batch, seq), np.int32)
    segment_ids[:, seq // 2:] = 2  # two packed documents per row
    positions = np.concatenate([np.arange(seq // 2), np.arange(seq - seq // 2)])[None].repeat(batch, 0)
    weights = np.ones((batch, seq), np.float32)
    weights[:, seq // 2 - 1] = 0.0  # no target across the document boundary
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "segment_ids": segment_ids,
            "positions": positions.astype(np.int32), "weights": weights}


def _run_steps(preset: str, mesh_shape: tuple[int, int, int], devices, n_steps: int = 3):
    c = lm.get_config(preset)
    c.train.warmup_steps, c.train.learning_rate = 0, 1e-3  # no warm-up: every step moves the parameters
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = mesh_shape
    model_cfg = model_config(c, 259)
    model = build_model(model_cfg)
    tx = make_optimizer(c.train)
    mesh = sharding.make_mesh(c.mesh, devices)
    rules = sharding.rules(c.mesh)
    task = get_task(c)
    state, shardings = init_state(model, tx, 0, (np.zeros((1, 32), np.int32),), mesh, rules)
    init_params = jax.device_get(state.params)
    train_fn, _ = steps.jit_steps(steps.make_train_step(model, task, tx, seed=0, use_dropout=False),
                                  steps.make_eval_step(model, task), shardings, mesh, rules)
    rng = np.random.default_rng(0)
    losses = []
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        for _ in range(n_steps):
            batch = jax.device_put(_synthetic_batch(rng, 8, 32, 259), sharding.batch_sharding(mesh, rules))
            state, m = train_fn(state, batch)
            losses.append(float(m["loss"]))
    return np.array(losses), jax.device_get(state.params), state, init_params


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["gpt2_tiny", "llama_tiny"])
@pytest.mark.parametrize("mesh_shape", [(2, 2, 2), (8, 1, 1), (1, 4, 2)])
def test_sharded_step_equals_single_device(preset, mesh_shape):
    assert jax.device_count() == 8
    ref_losses, ref_params, _, init = _run_steps(preset, (1, 1, 1), jax.devices()[:1])
    losses, params, state, _ = _run_steps(preset, mesh_shape, jax.devices())
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    flat = lambda t: np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)])
    a, b, a0 = flat(params), flat(ref_params), flat(init)
    assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b)
    assert np.linalg.norm(a - b) <= 1e-2 * np.linalg.norm(b - a0)  # small next to what 3 steps moved
    # Element-wise, far below one AdamW step (~lr = 1e-3), so no single parameter can be wrong. (Not
    # tighter: where the true gradient is ~0, like a key bias under softmax, Adam normalises rounding
    # noise into steps of a fraction of lr.)
    assert np.max(np.abs(a - b)) <= 5e-5
    # The state really is split across devices: some parameter is sharded on every non-trivial axis.
    specs = {str(x.sharding.spec) for x in jax.tree.leaves(state.params)}
    if mesh_shape[1] > 1:
        assert any("fsdp" in s for s in specs), specs
    if mesh_shape[2] > 1:
        assert any("tensor" in s for s in specs), specs


def test_schedule_warmup_then_cosine_to_fraction():
    c = lm.get_config().train
    c.update(dict(steps=100, warmup_steps=10, learning_rate=1.0, final_lr_fraction=0.1))
    s = make_schedule(c)
    warm = [float(s(t)) for t in range(10)]  # rising to the peak (where it starts: the warm-up's own tests)
    assert all(a <= b for a, b in zip(warm, warm[1:])) and 0 < warm[5] < 1.0
    assert math.isclose(float(s(9)), 1.0, rel_tol=1e-6)  # count 9: step 10, the warm-up's last
    assert math.isclose(float(s(99)), 0.1, rel_tol=1e-5)  # count 99: step 100, the last trained step
    assert float(s(54)) == pytest.approx(0.1 + 0.9 * 0.5, rel=1e-4)  # step 55: half-way down the cosine
    c.schedule = "linear"
    assert float(make_schedule(c)(54)) == pytest.approx(0.55, rel=1e-4)
    assert float(make_schedule(c)(99)) == pytest.approx(0.1, rel=1e-5)


@pytest.mark.slow
def test_weight_decay_skips_norms_and_biases():
    c = lm.get_config("gpt2_tiny")
    c.train.learning_rate, c.train.weight_decay, c.train.warmup_steps = 1e-2, 0.5, 0
    model = build_model(model_config(c, 259))
    tx = make_optimizer(c.train)
    mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
    state, _ = init_state(model, tx, 0, (np.zeros((1, 8), np.int32),), mesh, sharding.rules(c.mesh))
    zero_grads = jax.tree.map(np.zeros_like, state.params)
    updates, _ = tx.update(zero_grads, state.opt_state, state.params)
    for path, u in jax.tree_util.tree_leaves_with_path(updates):
        decayed = bool(np.any(np.asarray(u) != 0))
        assert decayed == (path[-1].key in ("kernel", "embedding")), jax.tree_util.keystr(path)


@pytest.mark.slow
def test_loss_falls_below_unigram_entropy(tmp_path, corpus_dir):
    c = tiny_config(corpus_dir, steps=400, batch_size=16, learning_rate=3e-3, warmup_steps=40,
                    eval_every=400, eval_steps=16, checkpoint_every=400, log_every=100)
    c.data.seq_len = 128
    summary = train(c, str(tmp_path / "run"), verbose=False)
    h = unigram_entropy(c.data, "validation", max_tokens=200_000)
    assert summary["status"] == "ok"
    assert summary["eval_loss"] < h - 0.4, (summary["eval_loss"], h)  # ~2.65 vs 3.19 nats when measured
    rows = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert rows[0]["train_loss"] > rows[-1]["train_loss"]
    for key in ("step", "train_loss", "learning_rate", "tokens", "flops", "tokens_per_second"):
        assert key in rows[-1]
    assert "eval_loss" in rows[-1]


def xla_step_flops(config) -> float:
    """FLOPs of one train step of `config` as XLA counts them in the compiled program (on one device)."""
    build = cli_module("bench").build

    one = config.copy_and_resolve_references()
    one.mesh.data, one.mesh.fsdp, one.mesh.tensor = 1, 1, 1
    cost = build(one, jax.devices()[:1])["compiled"].cost_analysis()
    return float((cost[0] if isinstance(cost, list) else cost)["flops"])


@pytest.mark.slow
def test_first_step_loss_is_log_vocab(tmp_path, corpus_dir):
    """Pins step 1: a freshly initialised LM predicts ~uniformly, so its loss is ~ln(V); the FLOPs the run
    reports are those XLA counts in its compiled step."""
    c = tiny_config(corpus_dir, steps=1, warmup_steps=0, log_every=1, eval_every=1, checkpoint_every=1)
    summary = train(c, str(tmp_path / "run"), verbose=False)
    assert summary["train_loss"] == pytest.approx(math.log(384), abs=0.15)  # 259 byte ids padded to 384
    assert summary["tokens"] == 8 * 64
    # XLA also counts the softmax, norms, activations and the AdamW update: a few percent more than the
    # matmuls the accounting counts (4.6% here); 6N alone (no attention term) would be 19% under it.
    ratio = xla_step_flops(c) / summary["flops"]
    assert 1.0 <= ratio <= 1.08, ratio


@pytest.mark.slow
def test_resume_equals_uninterrupted(tmp_path, corpus_dir):
    k = 10
    c = tiny_config(corpus_dir, steps=2 * k, checkpoint_every=4)
    full = train(c, str(tmp_path / "full"), verbose=False)
    part = train(c, str(tmp_path / "resumed"), verbose=False, stop_at=k)
    assert part["status"] == "preempted" and part["step"] == k
    resumed = train(c, str(tmp_path / "resumed"), verbose=False)
    assert resumed["status"] == "ok" and resumed["step"] == 2 * k
    assert resumed["eval_loss"] == full["eval_loss"] and resumed["train_loss"] == full["train_loss"]
    strip = lambda rows: [{k: v for k, v in r.items() if k != "tokens_per_second"} for r in rows]
    rows = lambda d: strip(json.loads(x) for x in open(tmp_path / d / "metrics.jsonl"))
    assert rows("resumed") == rows("full")
    # Final parameters identical bit for bit.
    params = []
    for d in ("full", "resumed"):
        model_cfg = model_config(c, 259)
        model, tx = build_model(model_cfg), make_optimizer(c.train)
        mesh = sharding.make_mesh(c.mesh)
        abstract, _ = abstract_state(model, tx, get_task(c).init_inputs(c), mesh, sharding.rules(c.mesh))
        it = make_lm_iterator(c.data, split="train", global_batch_size=8, seed=0)
        ck = checkpointing.Checkpointer(str(tmp_path / d / "checkpoints"))
        step, state = ck.restore(abstract, it)
        ck.close()
        assert step == 2 * k
        params.append(jax.device_get(state.params))
    for a, b in zip(jax.tree.leaves(params[0]), jax.tree.leaves(params[1])):
        np.testing.assert_array_equal(a, b)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, corpus_dir):
    """(config, workdir, summary) of a 2-step run on the (8, 1, 1) mesh, checkpointed at its end; the tests
    below that change it work on a copy."""
    c = tiny_config(corpus_dir, steps=2, eval_every=2, checkpoint_every=2)
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 8, 1, 1
    workdir = str(tmp_path_factory.mktemp("finished") / "run")
    summary = train(c, workdir, verbose=False)
    assert summary["status"] == "ok" and summary["step"] == 2
    return c, workdir, summary


def _copy_of(finished_run, tmp_path) -> tuple:
    """A deep copy of the finished run's config and of its workdir."""
    c, workdir, summary = finished_run
    shutil.copytree(workdir, str(tmp_path / "run"))
    return copy.deepcopy(c), str(tmp_path / "run"), summary


def test_restore_onto_another_mesh(finished_run):
    c, workdir, _ = finished_run
    c = copy.deepcopy(c)
    model_cfg = model_config(c, 259)
    model, tx = build_model(model_cfg), make_optimizer(c.train)
    restored = []
    for shape in ((8, 1, 1), (2, 2, 2)):
        c.mesh.data, c.mesh.fsdp, c.mesh.tensor = shape
        mesh = sharding.make_mesh(c.mesh)
        abstract, _ = abstract_state(model, tx, get_task(c).init_inputs(c), mesh, sharding.rules(c.mesh))
        ck = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"))
        _, state = ck.restore(abstract, make_lm_iterator(c.data, split="train", global_batch_size=8, seed=0))
        ck.close()
        assert state.params["token_embedding"]["embedding"].sharding.mesh.devices.shape == shape
        restored.append(jax.device_get(state))
    for a, b in zip(jax.tree.leaves(restored[0]), jax.tree.leaves(restored[1])):
        np.testing.assert_array_equal(a, b)


def test_rerun_of_a_finished_run_does_nothing(finished_run, tmp_path):
    c, workdir, first = _copy_of(finished_run, tmp_path)
    again = train(c, workdir, verbose=False)
    assert again == first


def test_workdir_with_another_runs_config_is_refused(finished_run, tmp_path):
    c, workdir, _ = _copy_of(finished_run, tmp_path)
    before = open(os.path.join(workdir, "config.json")).read()
    c.model.num_layers = 3
    with pytest.raises(ConfigError, match="different run's config.*model.num_layers"):
        train(c, workdir, verbose=False)
    assert open(os.path.join(workdir, "config.json")).read() == before


@pytest.mark.parametrize("change, match", [
    (dict(model=dict(num_heads=3)), r"model.num_heads=3 does not divide model.d_model=64"),
    (dict(model=dict(num_kv_heads=3)), r"model.num_kv_heads=3 does not divide model.num_heads=4.*valid num_kv_heads: \[1, 2, 4\]"),
    (dict(model=dict(activation="tanh")), r"model.activation='tanh' is not valid; choose one of relu, gelu"),
    (dict(model=dict(positional="xpos")), r"model.positional='xpos' is not valid; choose one of .*sinusoidal.*rope.*alibi"),
    (dict(mesh=dict(data=3)), r"mesh .* has 3 devices but 8 are available"),
    (dict(mesh=dict(data=-1, fsdp=3)), r"do not divide the 8 devices"),
    (dict(train=dict(batch_size=6)), r"train.batch_size=6 must be divisible by the data-parallel size 8"),
    (dict(train=dict(schedule="step")), r"train.schedule='step' is not valid; choose one of cosine, linear, constant"),
    (dict(train=dict(compute_dtype="int8")), r"train.compute_dtype='int8' is not valid"),
    (dict(data=dict(seq_len=4096)), r"data.seq_len=4096 exceeds model.max_len=1024"),
])
def test_bad_configs_fail_before_compiling(change, match, tmp_path):
    c = lm.get_config("gpt2_tiny")
    for section, values in change.items():
        c[section].update(values)
    with pytest.raises(ConfigError, match=match):
        model_cfg = model_config(c, 259)
        run_spec(c, model_cfg, 8, 1)


def test_unknown_preset_names_the_valid_ones():
    with pytest.raises(ValueError, match="unknown preset 'gpt5'.*valid presets: default, gpt2_tiny"):
        lm.get_config("gpt5")
