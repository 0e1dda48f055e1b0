"""Runs trained at once (vmapped over a run axis) equal the same runs trained one by one: the step
(multirun.py) and a group trained by the one training loop (loop.train_runs, sweep.multirun)."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import lm
from transformer.models import build_model
from transformer.tasks import get_task
from transformer.training import loop, multirun, sharding, steps
from transformer.training.resolve import model_config
from transformer.training.loop import train
from transformer.training.metrics import read_metrics
from transformer.training.optimizer import make_optimizer, make_schedule, with_peak_lrs
from transformer.training.state import init_state

T, B, STEPS = 32, 4, 4
LRS = (1e-3, 3e-3, 1e-2)
SEEDS = (0, 1, 0)


def _setup():
    c = lm.get_config("gpt2_tiny")
    c.data.seq_len, c.train.batch_size = T, B
    c.train.update(dict(steps=STEPS, warmup_steps=2, schedule="cosine"))
    c.mesh.data = 1
    cfg = model_config(c, 259)
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


def _group(c, model, task, lrs, seeds):
    """R runs stacked as the loop stacks them: each initialised alone, with its own peak learning rate."""
    tx = make_optimizer(c.train)
    mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
    rules = sharding.rules(c.mesh)
    states = []
    for lr, seed in zip(lrs, seeds):
        state, shardings = init_state(model, tx, seed, task.init_inputs(c), mesh, rules)
        states.append(state.replace(opt_state=with_peak_lrs(state.opt_state, lr)))
    train_fn, eval_fn = steps.jit_steps(steps.make_train_step(model, task, tx, seed=0, use_dropout=False),
                                        steps.make_eval_step(model, task), shardings, mesh, rules, runs=len(lrs))
    return multirun.stack(states), train_fn, eval_fn, mesh


@pytest.mark.slow
def test_multirun_equals_separate_runs():
    c, model, task = _setup()
    states, train_fn, _, mesh = _group(c, model, task, LRS, SEEDS)
    together = []
    with jax.set_mesh(mesh):
        for batch in _batches():
            stacked = {k: np.stack([v] * len(LRS)) for k, v in batch.items()}
            states, m = train_fn(states, stacked)
            assert m["loss"].shape == (len(LRS),)
            together.append(np.asarray(m["loss"]))
    together = np.stack(together, axis=1)  # (R, STEPS)
    for r, (lr, seed) in enumerate(zip(LRS, SEEDS)):
        np.testing.assert_allclose(together[r], _separate(c, model, task, lr, seed), rtol=2e-5)
    # the runs really differ: learning rates (runs 0, 2 share a seed) and seeds change the losses
    assert abs(together[0, -1] - together[2, -1]) > 1e-3
    assert abs(together[0, 0] - together[1, 0]) > 1e-4
    assert int(states.step[0]) == STEPS


@pytest.mark.slow  # CI's time (the default run is at its 15 minutes); -m slow runs it
def test_multi_eval_and_unstack():
    c, model, task = _setup()
    states, _, eval_fn, mesh = _group(c, model, task, (1e-3, 1e-3), (3, 4))
    with jax.set_mesh(mesh):
        sums = eval_fn(states.params, jax.tree.map(jnp.asarray, _batches()[0]))  # one batch shared by the runs
    one = jax.jit(steps.make_eval_step(model, task))(multirun.unstack(states.params, 1), _batches()[0])
    assert float(sums["loss_sum"][1]) == pytest.approx(float(one["loss_sum"]), rel=1e-5)
    assert float(sums["loss_sum"][0]) != pytest.approx(float(sums["loss_sum"][1]), rel=1e-4)


def test_the_peak_learning_rate_is_state_not_program():
    """One optimizer form for every run: the update scales with the PeakLR held in the state."""
    c, model, task = _setup()
    tx = make_optimizer(c.train)
    params = {"w": jnp.ones((3,))}
    grads = {"w": jnp.asarray([1.0, -2.0, 0.5])}
    s1 = with_peak_lrs(tx.init(params), 1e-3)
    s2 = with_peak_lrs(tx.init(params), 4e-3)
    _, s1 = tx.update(grads, s1, params)  # step 0: the warm-up's rate is 0; compare the second update
    _, s2 = tx.update(grads, s2, params)
    u1, _ = tx.update(grads, s1, params)
    u2, _ = tx.update(grads, s2, params)
    np.testing.assert_allclose(np.asarray(u2["w"]), 4 * np.asarray(u1["w"]), rtol=1e-6)
    assert float(jnp.abs(u1["w"]).max()) > 0


# ---- sweep.multirun: a group trained by loop.train_runs, each run with its own files -------------

GROUP_LRS, GROUP_SEEDS, GROUP_STEPS = (1e-3, 3e-3, 1e-2), (0, 1, 0), 6


def _group_configs(corpus_dir: str) -> list:
    configs = []
    for lr, seed in zip(GROUP_LRS, GROUP_SEEDS):
        c = lm.get_config("gpt2_tiny")
        c.data.data_dir, c.data.seq_len = corpus_dir, 32
        c.train.update(steps=GROUP_STEPS, warmup_steps=2, batch_size=8, eval_every=3, eval_steps=2,
                       checkpoint_every=3, log_every=3, learning_rate=lr, seed=seed, schedule="cosine")
        configs.append(c)
    return configs


def _losses(workdir) -> list[float]:
    return [row["train_loss"] for row in read_metrics(str(workdir))]


@pytest.fixture(scope="module")
def grouped(tmp_path_factory, corpus_dir):
    """The three runs trained as one group, uninterrupted: (workdirs, summaries)."""
    dirs = [str(tmp_path_factory.mktemp(f"group_{r}")) for r in range(len(GROUP_LRS))]
    return dirs, loop.train_runs(_group_configs(corpus_dir), dirs, verbose=False)


@pytest.mark.slow
def test_group_equals_runs_trained_alone(grouped, corpus_dir, tmp_path):
    dirs, summaries = grouped
    for r, config in enumerate(_group_configs(corpus_dir)):
        alone = train(config, str(tmp_path / f"alone_{r}"), verbose=False)
        s = summaries[r]
        assert s["status"] == "ok" and s["step"] == GROUP_STEPS and s["multirun"] == len(GROUP_LRS)
        assert s["eval_loss"] == pytest.approx(alone["eval_loss"], rel=1e-4)
        np.testing.assert_allclose(_losses(dirs[r]), _losses(tmp_path / f"alone_{r}"), rtol=1e-4)
        for name in ("config.json", "metrics.jsonl", "summary.json"):
            assert (tmp_path / f"alone_{r}" / name).exists() and os.path.exists(os.path.join(dirs[r], name))
        # train()'s own rows: learning rate per run, evaluations where train() makes them
        rows = read_metrics(dirs[r])
        assert [row["step"] for row in rows] == [3, 6] and "eval_loss" in rows[-1]
        assert rows[0]["learning_rate"] == pytest.approx(make_schedule(config.train)(2))
    assert len({round(s["eval_loss"], 5) for s in summaries}) == len(GROUP_LRS)  # the runs really differ


@pytest.mark.slow
def test_group_preempted_resumes_alone_or_as_group_to_the_same_result(grouped, corpus_dir, tmp_path):
    dirs = [str(tmp_path / f"run_{r}") for r in range(len(GROUP_LRS))]
    configs = _group_configs(corpus_dir)
    stopped = loop.train_runs(configs, dirs, verbose=False, stop_at=4)
    assert [s["status"] for s in stopped] == ["preempted"] * 3 and all(s["step"] == 4 for s in stopped)
    # run 0 resumes alone from the group's checkpoint (train()'s format)...
    alone = train(configs[0], dirs[0], verbose=False)
    assert alone["eval_loss"] == pytest.approx(grouped[1][0]["eval_loss"], rel=1e-4)
    # ... so it no longer matches the others' step: they cannot regroup with it
    with pytest.raises(multirun.GroupMismatch, match=r"steps \[4, 6\]"):
        loop.train_runs(configs, dirs, verbose=False)
    # runs 1 and 2 resume together
    resumed = loop.train_runs(configs[1:], dirs[1:], verbose=False)
    for r, s in zip((1, 2), resumed):
        assert s["status"] == "ok" and s["eval_loss"] == pytest.approx(grouped[1][r]["eval_loss"], rel=1e-4)
        np.testing.assert_allclose(_losses(dirs[r]), _losses(grouped[0][r]), rtol=1e-4)


def test_group_key_groups_only_learning_rate_and_seed(corpus_dir):
    a, b, c = _group_configs(corpus_dir)
    assert multirun.group_key(a) == multirun.group_key(b) == multirun.group_key(c)
    other = a.copy_and_resolve_references()
    other.train.steps += 1
    assert multirun.group_key(other) != multirun.group_key(a)
    other = a.copy_and_resolve_references()
    other.model.dropout_rate = 0.1
    assert multirun.group_key(other) is None
    with pytest.raises(ValueError, match="differ only in train.learning_rate and train.seed"):
        other = a.copy_and_resolve_references()
        other.model.num_layers += 1
        loop.train_runs([a, other], ["/nonexistent/a", "/nonexistent/b"], verbose=False)


@pytest.mark.slow
def test_a_diverging_run_fails_alone_and_the_group_goes_on(grouped, corpus_dir, tmp_path, monkeypatch):
    configs = _group_configs(corpus_dir)[:2]
    configs[1].train.learning_rate = 1e30  # parameters overflow to inf within a step or two
    dirs = [str(tmp_path / "ok"), str(tmp_path / "diverged")]
    compiled_for, compile_step = [], loop.compile_step

    def recording(step, states, batch_spec):
        compiled_for.append(int(states.step.shape[0]))  # the run axis
        return compile_step(step, states, batch_spec)

    monkeypatch.setattr(loop, "compile_step", recording)
    ok, bad = loop.train_runs(configs, dirs, verbose=False)
    assert compiled_for == [2, 1]  # the failed run left the step: it is no longer computed
    assert bad["status"] == "failed" and "non-finite" in bad["error"] and "trained in a group" in bad["error"]
    assert not os.path.exists(os.path.join(dirs[1], "checkpoints", str(GROUP_STEPS)))  # no NaN state saved
    assert ok["status"] == "ok" and ok["eval_loss"] == pytest.approx(grouped[1][0]["eval_loss"], rel=1e-4)


@pytest.mark.slow
def test_skip_policy_counts_each_runs_skipped_updates(corpus_dir, tmp_path):
    configs = _group_configs(corpus_dir)[:2]
    for c in configs:
        c.train.nonfinite = "skip"
    configs[1].train.learning_rate = 1e30  # every update after the first overflows: skipped
    ok, bad = loop.train_runs(configs, [str(tmp_path / "ok"), str(tmp_path / "skips")], verbose=False)
    assert ok["status"] == "ok" and ok["skipped_updates"] == 0
    assert [row["skipped_updates"] for row in read_metrics(str(tmp_path / "ok"))][-1] == 0
    # more than train.max_skipped_fraction of its steps dropped: the run fails with the reason and leaves the
    # group, which goes on (it used to end "ok")
    assert bad["status"] == "failed" and "train.max_skipped_fraction=0.1" in bad["error"]
    assert 0 < bad["skipped_updates"] < GROUP_STEPS and ok["step"] == GROUP_STEPS
