"""Continuing a wsd run started with the default warm-up (train.warmup_steps=-1, which follows train.steps): the
continuation keeps the first run's resolved warm-up, as the README's "continue a wsd run" says, with no setting."""
from __future__ import annotations

import pytest

import json
import os

from ml_collections import ConfigDict

from test_reliability import _rows, tiny_config
from transformer.training.loop import train
from transformer.training.run_io import check_workdir_config


def _wsd(corpus_dir: str, steps: int, warmup: int = -1) -> ConfigDict:
    c = tiny_config(corpus_dir, steps=steps, warmup_steps=warmup, checkpoint_every=5, eval_every=5, log_every=1,
                    keep_checkpoints=1)
    c.train.update(dict(schedule="wsd", decay_fraction=0.25, final_lr_fraction=0.0))
    return c


@pytest.mark.slow
def test_a_wsd_run_started_with_defaults_continues_to_more_steps(corpus_dir, tmp_path):
    """10 steps with warm-up -1 resolve to a 1-step warm-up (10% of 10), decaying from step 8; rerun with
    train.steps=20 (whose own default would be 2 warm-up steps) it continues from step 8 with the 1-step warm-up
    (tests/test_wsd.py: a continuation ends exactly like the longer run). The old code refused it ("set it
    explicitly"; and set explicitly, "differs in train.steps, train.warmup_steps")."""
    run = str(tmp_path / "run")
    assert train(_wsd(corpus_dir, 10), run, verbose=False)["step"] == 10
    first_rows = _rows(run)
    out = train(_wsd(corpus_dir, 20), run, verbose=False)  # the README's command: more steps, nothing else
    assert out["status"] == "ok" and out["step"] == 20
    rows = _rows(run)
    assert [r["step"] for r in rows if "train_loss" in r] == list(range(1, 21))
    assert rows[:len([r for r in first_rows if r["step"] <= 8])] == [r for r in first_rows if r["step"] <= 8]
    aside = sorted(int(d.split("-")[0]) for d in os.listdir(os.path.join(run, "superseded_checkpoints")))
    assert aside == [10]  # the first run's decay, set aside: the run continued from its decay start
    assert json.load(open(os.path.join(run, "config.json")))["train"]["warmup_steps"] == 1
    again = train(_wsd(corpus_dir, 20), run, verbose=False)  # the same command again: finished, nothing to do
    assert again["status"] == "ok" and again["step"] == 20


def _record(workdir, steps: int, warmup: int) -> dict:
    config = {"train": {"steps": steps, "warmup_steps": warmup, "schedule": "wsd", "decay_fraction": 0.25},
              "data": {}, "model": {}}
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(config, f)
    return config


def test_an_explicit_warm_up_equal_to_the_resolved_one_continues(tmp_path):
    """The other half of the old dead end: the first run recorded warm-up -1 (resolving to 10 steps for 100 steps);
    the continuation given that warm-up explicitly, 10, continues from the decay start (75) instead of being
    refused as another run's config."""
    old = _record(str(tmp_path), steps=100, warmup=-1)
    longer = {**old, "train": {**old["train"], "steps": 200, "warmup_steps": 10}}
    assert check_workdir_config(str(tmp_path), longer) == 75
    resumed = {**old, "train": {**old["train"], "warmup_steps": 10}}  # the same run, its warm-up written out
    assert check_workdir_config(str(tmp_path), resumed) is None


def test_the_recorded_warm_up_is_kept_only_for_the_default(tmp_path):
    """keep_recorded_warmup (run_setup.prepare and the train dry run call it): warm-up -1 on a workdir whose run
    resolved 10 steps (100 steps, -1) becomes 10 (the default for 300 steps would be 30), in a copy; an explicit
    warm-up, or a workdir without a run, is left alone."""
    from configs.lm import get_config
    from transformer.training.resolve import keep_recorded_warmup

    _record(str(tmp_path), steps=100, warmup=-1)
    config = get_config("gpt2_tiny")
    config.train.update(steps=300, warmup_steps=-1, schedule="wsd")
    kept, warmup = keep_recorded_warmup(config, str(tmp_path))
    assert (warmup, kept.train.warmup_steps, config.train.warmup_steps) == (10, 10, -1)
    config.train.warmup_steps = 7
    assert keep_recorded_warmup(config, str(tmp_path)) == (config, None)
    config.train.warmup_steps = -1
    assert keep_recorded_warmup(config, str(tmp_path / "new")) == (config, None)
