"""The learning rate an update is really made with: step 1 trains (no step at rate 0), and under
train.nonfinite="skip" a dropped update does not hold the schedule back (it follows the train step)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from ml_collections import ConfigDict

from configs import lm
from test_reliability import _final_state, _poison_step, tiny_config
from transformer.spec import TrainSpec
from transformer.training.loop import train
from transformer.training.optimizer import make_optimizer
from transformer.training.metrics import read_metrics

# linear schedule, peak 1, 4 warm-up steps, 12 steps, decaying to 0: the rate of step k (1-based), typed out
# (warm-up k/4, then 1 − (k − 4)/8 from step 5 on: the last step, 12, trains at 0, the final fraction)
EXPECTED = [0.25, 0.5, 0.75, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0]


def _sign_descent(nonfinite: str) -> ConfigDict:
    """A train block whose update is −lr·sign(g): Adam with b1 = b2 = 0, no clipping, no weight decay."""
    return ConfigDict(dict(steps=12, warmup_steps=4, learning_rate=1.0, schedule="linear", final_lr_fraction=0.0,
                           b1=0.0, b2=0.0, eps=1e-12, weight_decay=0.0, grad_clip=0.0, nonfinite=nonfinite))


def _rates(nonfinite: str, bad_step: int | None) -> list[float]:
    """|update| of each of len(EXPECTED) steps, the gradient of `bad_step` (1-based) made NaN."""
    tx = make_optimizer(_sign_descent(nonfinite))
    params = {"dense": {"kernel": jnp.ones((3,))}}
    state, rates = tx.init(params), []
    update = jax.jit(tx.update)
    for step in range(1, len(EXPECTED) + 1):
        g = jnp.full((3,), jnp.nan if step == bad_step else 0.5)
        u, state = update({"dense": {"kernel": g}}, state, params)
        rates.append(float(jnp.max(jnp.abs(u["dense"]["kernel"]))))
    return rates


def test_each_step_trains_at_its_scheduled_rate_the_first_included():
    np.testing.assert_allclose(_rates("stop", None), EXPECTED, rtol=1e-5)


def test_a_skipped_update_does_not_hold_the_schedule_back():
    rates = _rates("skip", bad_step=6)
    assert rates[5] == 0.0  # step 6 dropped
    expected = EXPECTED[:5] + [0.0] + EXPECTED[6:]  # the later steps at their own step's rate, not one behind
    np.testing.assert_allclose(rates, expected, rtol=1e-5)


def test_one_update_of_a_default_run_moves_the_parameters():
    tx = make_optimizer(lm.get_config("gpt2_tiny").train)
    params = {"dense": {"kernel": jnp.ones((3,))}}
    u, _ = tx.update({"dense": {"kernel": jnp.full((3,), 0.5)}}, tx.init(params), params)
    new = optax.apply_updates(params, u)
    assert float(jnp.max(jnp.abs(new["dense"]["kernel"] - params["dense"]["kernel"]))) > 0


def _schedule_count(opt_state) -> int:
    counts = [int(s.count) for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState))
              if isinstance(s, optax.ScaleByScheduleState)]
    assert len(counts) == 1, counts
    return counts[0]


@pytest.mark.slow  # CI's 15 minutes: 17 s of the default run on 2 loaded cores (2026-11-27)
def test_a_skip_run_logs_the_rate_it_trains_with(monkeypatch, corpus_dir, tmp_path):
    """A run that drops step 7's update: at the end its schedule stands at the last step (not one behind), and
    each logged learning rate is the schedule's rate for that step."""
    c = tiny_config(corpus_dir, log_every=2, checkpoint_every=4, nonfinite="skip", warmup_steps=4,
                    schedule="linear", final_lr_fraction=0.0)
    _poison_step(monkeypatch, c, bad_step=7)
    workdir = str(tmp_path / "run")
    summary = train(c, workdir, verbose=False)
    assert summary["status"] == "ok" and summary["skipped_updates"] == 1
    step, state = _final_state(workdir)
    assert step == 12 and _schedule_count(state.opt_state) == 12
    spec = TrainSpec.from_config(c.train)
    for row in read_metrics(workdir):
        assert row["learning_rate"] == pytest.approx(float(spec.lr_at(row["step"] - 1)), rel=1e-6)
