"""A run's first invocation on a machine whose TFDS dataset is not prepared yet records its data identity at once
(before, config.json and its checkpoints held none until the next invocation, so a resume on other data could not
be refused)."""
from __future__ import annotations

import json
import os

import pytest

from configs.lm import get_config
from transformer.data import sources
from transformer.training.loop import train


@pytest.mark.slow  # CI's 15 minutes: 37 s of the default run on 2 loaded cores (2026-11-27)
def test_a_first_run_on_an_unprepared_dataset_records_its_data_identity(tmp_path):
    config = get_config("gpt2_tiny")
    config.data.data_dir = str(tmp_path / "tfds")  # nothing prepared here yet
    config.data.seq_len = 32
    config.train.update(steps=1, warmup_steps=0, batch_size=8, eval_every=1, eval_steps=1, checkpoint_every=1,
                        log_every=1)
    assert not sources.is_available(config.data)
    workdir = str(tmp_path / "run")
    assert train(config, workdir, verbose=False)["status"] == "ok"
    with open(os.path.join(workdir, "config.json")) as f:
        recorded = json.load(f)["data"].get("identity")
    assert recorded and recorded["source"] and recorded["tokenizer"] and recorded["cache_key"]
