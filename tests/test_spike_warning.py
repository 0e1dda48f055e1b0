"""A loss-spike warning names its run and the batch that caused it (two runs warning at one step must be
told apart, and whether they saw the same batch must be readable from the warnings)."""
from __future__ import annotations

import pytest

from configs.lm import get_config
from transformer.training import loop, nonfinite


@pytest.mark.slow  # CI's 15 minutes: 15 s of the default run on 2 loaded cores (2026-11-27)
def test_a_loss_spike_warning_names_the_run_and_its_batch(tmp_path, corpus_dir, capsys, monkeypatch):
    def spike_at_step_3(self, window, logged_loss):  # a real spike needs hundreds of steps; force one
        return next(((s, 5.0) for s, _ in window if s == 3), None)

    monkeypatch.setattr(nonfinite.SpikeDetector, "check", spike_at_step_3)
    c = get_config("gpt2_tiny")
    c.data.data_dir, c.data.seq_len = corpus_dir, 32
    c.train.update(steps=4, batch_size=8, log_every=1, eval_every=4, eval_steps=1, checkpoint_every=4, seed=7)
    workdir = str(tmp_path / "run_a")
    assert loop.train(c, workdir, verbose=False)["status"] == "ok"
    warnings = [line for line in capsys.readouterr().out.splitlines() if "loss spike" in line]
    assert len(warnings) == 1, warnings
    assert workdir in warnings[0] and "at step 3" in warnings[0]
    assert (f"batch is number 2 of split '{c.data.train_split}' shuffled with data.shuffle_seed="
            f"{c.data.shuffle_seed}, train.seed=7" in warnings[0])
