"""Warm-up–stable–decay (Hägele et al. 2024): the schedule, and a run continued to more steps on its workdir
(its stable phase extended) ending exactly like a run trained to that length from the start."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from ml_collections import ConfigDict

from test_reliability import _rows, tiny_config
from transformer.spec import ConfigError
from transformer.training.loop import train
from transformer.training.optimizer import decay_start, make_schedule


def _train_cfg(**kw) -> ConfigDict:
    c = ConfigDict(dict(steps=100, warmup_steps=10, learning_rate=2.0, schedule="wsd", decay_fraction=0.2,
                        final_lr_fraction=0.0))
    c.update(kw)
    return c


def test_wsd_is_flat_until_the_decay_and_a_longer_run_shares_it():
    short, long = _train_cfg(final_lr_fraction=0.1), _train_cfg(steps=250, final_lr_fraction=0.1)
    assert decay_start(short) == 80 and decay_start(long) == 200  # the last decay_fraction = 20% of the steps
    f, g = make_schedule(short), make_schedule(long)
    # the rates of the trained steps: lr_f[s] is step s's (update count s - 1), s = 1 .. 100; lr_f[0] unused
    lr_f = np.array([np.nan] + [f(s - 1) for s in range(1, 101)])
    lr_g = np.array([np.nan] + [g(s - 1) for s in range(1, 251)])
    np.testing.assert_allclose(lr_f[1:81], lr_g[1:81], rtol=0, atol=0)  # one run through the short one's decay start
    np.testing.assert_allclose(lr_f[10:81], 2.0, rtol=1e-6)             # the peak from the warm-up's end (step 10)
    assert np.all(np.diff(lr_f[1:11]) > 0) and 0 < lr_f[5] < 2.0       # a warm-up rising to the peak
    cooldown = lr_f[80:]                                                # steps 80 (decay start) .. 100 (last)
    assert np.all(np.diff(cooldown) < 0)                                # strictly falling through the cooldown
    assert cooldown[-1] == pytest.approx(0.1 * 2.0, rel=1e-5)           # final_lr_fraction·peak at step 100
    # Hägele et al. 2024, "1 - sqrt" cooldown over its T steps, from the peak η to the final rate η_end:
    # η(τ) = η_end + (η - η_end)·(1 - sqrt(τ/T)), τ = 1 .. T the cooldown's steps. A quarter of the way in
    # (τ = 5 of T = 20: step 85), sqrt(1/4) = 1/2: half-way between.
    assert lr_f[85] == pytest.approx(0.5 * (2.0 + 0.2), rel=1e-5)      # (a linear decay: 1.55; cosine: 1.83)


def test_wsd_refuses_a_warm_up_that_reaches_into_the_decay():
    with pytest.raises(ConfigError, match="overlaps the decay"):
        make_schedule(_train_cfg(warmup_steps=90))


def _wsd(corpus_dir: str, steps: int) -> ConfigDict:
    c = tiny_config(corpus_dir, steps=steps, warmup_steps=2, checkpoint_every=5, eval_every=5, log_every=1,
                    keep_checkpoints=1)
    c.train.update(dict(schedule="wsd", decay_fraction=0.25, final_lr_fraction=0.0))
    return c


@pytest.mark.slow
def test_a_wsd_run_continued_to_more_steps_equals_the_longer_run(corpus_dir, tmp_path):
    longer = str(tmp_path / "longer")
    ref = train(_wsd(corpus_dir, 16), longer, verbose=False)
    run = str(tmp_path / "run")
    first = train(_wsd(corpus_dir, 8), run, verbose=False)  # decays from step 6 to 8
    assert first["status"] == "ok" and first["step"] == 8
    assert 6 in {int(s) for s in os.listdir(os.path.join(run, "checkpoints"))}  # kept: keep_checkpoints=1
    out = train(_wsd(corpus_dir, 16), run, verbose=False)  # continues from step 6 (the decay start)
    assert out["status"] == "ok" and out["step"] == 16
    assert out["eval_loss"] == ref["eval_loss"] and out["train_loss"] == ref["train_loss"]
    assert _rows(run) == _rows(longer)  # the first run's decay rows are gone, the longer run's rows in place
    aside = sorted(int(d.split("-")[0]) for d in os.listdir(os.path.join(run, "superseded_checkpoints")))
    assert aside == [8]  # the old decay's checkpoint is kept aside, not deleted
    assert json.load(open(os.path.join(run, "config.json")))["train"]["steps"] == 16


@pytest.mark.slow
def test_only_a_wsd_run_continues_and_only_to_more_steps(corpus_dir, tmp_path):
    run = str(tmp_path / "run")
    train(_wsd(corpus_dir, 8), run, verbose=False)
    with pytest.raises(ConfigError, match="only to more steps"):
        train(_wsd(corpus_dir, 6), run, verbose=False)
    cosine = str(tmp_path / "cosine")
    train(tiny_config(corpus_dir, steps=8, warmup_steps=2), cosine, verbose=False)
    with pytest.raises(ConfigError, match="only with train.schedule='wsd'"):
        train(tiny_config(corpus_dir, steps=16, warmup_steps=2), cosine, verbose=False)


@pytest.mark.slow
def test_a_sweep_branch_seeded_from_its_source_equals_the_run_trained_alone(corpus_dir, tmp_path):
    """runner.seed_branch copies the source run's decay-start checkpoint into the branch's workdir; training
    the branch from there ends exactly like training its config from step 0."""
    from transformer.sweeps import runner

    sweep = str(tmp_path / "sweep")
    train(_wsd(corpus_dir, 8), os.path.join(sweep, "runs", "src"), verbose=False)
    run = {"run_id": "branch", "branch_from": "src", "start_step": 6}
    assert runner.seed_branch(sweep, run)
    assert not runner.seed_branch(sweep, run)  # seeded once; later it resumes from its own checkpoints
    branched = train(_wsd(corpus_dir, 16), os.path.join(sweep, "runs", "branch"), verbose=False)
    alone = train(_wsd(corpus_dir, 16), str(tmp_path / "alone"), verbose=False)
    assert branched["eval_loss"] == alone["eval_loss"] and branched["tokens"] == alone["tokens"]
    rows = lambda w: [r for r in _rows(w) if r["step"] > 6]
    assert rows(os.path.join(sweep, "runs", "branch")) == rows(str(tmp_path / "alone"))
    missing = {"run_id": "orphan", "branch_from": "src", "start_step": 5}  # no checkpoint 5 there
    assert not runner.seed_branch(sweep, missing)
