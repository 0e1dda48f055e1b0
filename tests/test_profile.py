"""The profiler window (logging.profile_start, logging.profile_count): a trace of exactly those steps in
DIR/profile/, for TensorBoard's profile plugin, and the same results as without it."""
from __future__ import annotations

import glob
import gzip
import json
import os
import re

import pytest

from configs.lm import get_config
from transformer.spec import ConfigError
from transformer.training.loop import train
from transformer.training.metrics import read_metrics
from transformer.training.resolve import resolve

TIMING = ("tokens_per_second",)


@pytest.mark.slow  # 15 s on 2 cores (a profiled run end to end)
def test_profiled_steps_are_traced_and_results_do_not_change(tiny_lm_run, corpus_dir, tmp_path):
    """tiny_lm_run (conftest) again with steps 2..3 traced: the same rows, and a trace of those steps."""
    config = get_config("gpt2_tiny")
    config.data.data_dir, config.data.seq_len = corpus_dir, 32
    config.train.update(steps=4, warmup_steps=1, batch_size=8, eval_every=4, eval_steps=1, checkpoint_every=2,
                        log_every=2)
    config.logging.update(profile_start=2, profile_count=2)
    workdir = str(tmp_path / "run")
    assert train(config, workdir, verbose=False)["status"] == "ok"

    ref_config, got_config = ({k: v for k, v in json.load(open(os.path.join(d, "config.json"))).items()
                               if k != "logging"} for d in (tiny_lm_run, workdir))
    assert got_config == ref_config  # the reference run's config, but for the profiler window
    ref, got = read_metrics(tiny_lm_run), read_metrics(workdir)
    assert [{k: v for k, v in r.items() if k not in TIMING} for r in got] == \
           [{k: v for k, v in r.items() if k not in TIMING} for r in ref]

    (xplane,) = glob.glob(os.path.join(workdir, "profile", "plugins", "profile", "*", "*.xplane.pb"))
    assert os.path.getsize(xplane) > 0
    (trace,) = glob.glob(os.path.join(os.path.dirname(xplane), "*.trace.json.gz"))
    events = json.load(gzip.open(trace))["traceEvents"]
    steps = sorted(int(e["args"]["step_num"]) for e in events if e.get("name") == "train")
    assert steps == [2, 3]  # the window's StepTraceAnnotations, nothing before or after it
    executions = [e for e in events if re.search(r"Execute.*train_step", str(e.get("name")))]
    per_device = {e["name"] for e in executions}
    assert executions and all(sum(e["name"] == n for e in executions) == 2 for n in per_device)  # both steps ran


@pytest.mark.parametrize("start, count, match", [
    (4, 2, r"profiles steps 4..5, beyond train.steps=4"),
    (2, 0, r"logging.profile_count=0 gives an empty profiler window"),
    (-1, 2, r"logging.profile_start=-1 must be a non-negative integer"),
])
def test_a_window_outside_the_run_is_a_config_error(start, count, match):
    config = get_config("gpt2_tiny")
    config.train.steps = 4
    config.logging.profile_start = start
    config.logging.profile_count = count
    with pytest.raises(ConfigError, match=match):
        resolve(config, 8, 1)
    config.logging.update(profile_start=4, profile_count=1)
    resolve(config, 8, 1)  # the last step alone is a window
