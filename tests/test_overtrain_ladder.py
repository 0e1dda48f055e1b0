"""The over-training ladder (experiments/overtrain_ladder.py): one wsd run per size, continued to each
tokens-per-parameter branch, a CSV row per branch; its bad inputs refused before anything trains or is written."""
from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

from cli_modules import cli_module
from transformer.spec import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(data_dir: str = ""):
    from configs.sweeps import cpu
    config = cpu.get_config()
    config.base.data.data_dir = data_dir
    config.base.model.vocab_size = 259  # the byte tokenizer's, named: no tokenizer module to import (seconds)
    return config


def test_plan_follows_the_cpu_sweep_rules_and_refuses_bad_branches():
    ladder = cli_module("overtrain_ladder")
    sizes = ladder.plan(_config(), [24, 32], [640, 20], [5, 10, 20, 40], seed=3, lr_coefficient=1.4)
    assert [s["shape"].name for s in sizes] == ["d24-L2", "d32-L2"]
    assert [len(s["branches"]) for s in sizes] == [4, 3]  # the second size stops at its 20 tokens per parameter
    for s in sizes:
        assert s["params_non_embedding"] >= s["params"] / 2
        assert s["learning_rate"] == pytest.approx(1.4 * s["params"] ** -0.5, rel=1e-3)
        steps = [cfg["train"]["steps"] for _, cfg in s["branches"]]
        assert steps == sorted(steps) and len(set(steps)) == len(steps)
        for t, cfg in s["branches"]:  # one warm-up for every branch: each continues the one before
            assert cfg["train"]["warmup_steps"] == s["warmup_steps"] and cfg["train"]["seed"] == 3
            assert cfg["train"]["schedule"] == "wsd"
            tokens = cfg["train"]["steps"] * cfg["train"]["batch_size"] * cfg["data"]["seq_len"]
            assert tokens / s["params"] == pytest.approx(t, rel=0.02)
    with pytest.raises(ConfigError, match="must increase"):
        ladder.plan(_config(), [24], [640], [10, 5], seed=0, lr_coefficient=1.4)
    with pytest.raises(ConfigError, match="one value or one per size"):
        ladder.plan(_config(), [24, 32, 40], [640, 20], [5, 10], seed=0, lr_coefficient=1.4)
    with pytest.raises(ConfigError, match="below every branch"):
        ladder.plan(_config(), [24], [2], [5, 10], seed=0, lr_coefficient=1.4)
    cosine = _config()
    cosine.base.train.schedule = "cosine"
    with pytest.raises(ConfigError, match="wsd"):
        ladder.plan(cosine, [24], [640], [5, 10], seed=0, lr_coefficient=1.4)


def test_a_branch_beyond_max_epochs_is_refused_before_training(corpus_dir):
    ladder = cli_module("overtrain_ladder")
    sizes = ladder.plan(_config(corpus_dir), [24], [640], [5, 640], seed=0, lr_coefficient=1.4)
    tokens = ladder.check_epochs(sizes, 4.0)  # 640 tokens per parameter of N = 23,784: 0.5 passes
    assert tokens > 1e6
    with pytest.raises(ConfigError, match=r"d24-L2 at 640 tokens per parameter reads the training split .* "
                                          r"--max_epochs=0.1"):
        ladder.check_epochs(sizes, 0.1)


@pytest.mark.slow
def test_ladder_end_to_end_continues_each_size_and_resumes(tmp_path, corpus_dir):
    """Two tiny sizes, two branches each (1 and 2 tokens per parameter): one workdir per size, the second branch
    continued from the first's decay start (its old decay set aside), a CSV row per branch; rerun, nothing trains
    again and the CSV is unchanged."""
    out, workdir = tmp_path / "ladder.csv", tmp_path / "runs"
    args = [sys.executable, "-m", "experiments.overtrain_ladder", f"--out={out}", f"--workdir={workdir}",
            "--d_models=16,24", "--tokens_per_param=1,2", "--max_tokens_per_param=2", f"--config.base.data.data_dir={corpus_dir}",
            "--config.base.train.eval_steps=2"]
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["size"], round(float(r["tokens_per_param"]))) for r in rows] == [
        ("d16-L2", 1), ("d16-L2", 2), ("d24-L2", 1), ("d24-L2", 2)]
    for r in rows:
        assert float(r["loss"]) > 0 and float(r["bits_per_byte"]) > 0 and float(r["epochs"]) > 0
        assert int(r["tokens"]) == int(r["steps"]) * 8 * 128 and r["seed"] == "0"
        assert float(r["flops"]) > 6 * int(r["params"]) * int(r["tokens"])  # attention counted
    for size in ("d16-L2", "d24-L2"):
        assert os.listdir(workdir / size / "superseded_checkpoints")  # the first branch's decay, set aside
    first = out.read_text()
    again = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert out.read_text() == first and "tokens/param: loss" not in again.stdout
