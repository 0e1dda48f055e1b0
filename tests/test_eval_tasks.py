"""Tasks scored in the loop (train.eval_tasks, issue 32 §2): at every evaluation, through the evaluators' registry,
on the run's mesh, into metrics.jsonl (tasks/NAME/...), summary.json and a sweep's results rows (`tasks`); the
in-loop values equal experiments.evaluate's on the run's final checkpoint (one device, another batch size); a group
(sweep.multirun) gets each run's own values; a bad task is one error before anything is written."""
from __future__ import annotations

import os

import pytest
from test_task_scoring import write_task

from configs import lm
from cli_modules import cli_module

evaluate = cli_module("evaluate").evaluate
from transformer.spec import ConfigError
from transformer.sweeps.execute import SHAPE_KEYS, result_row
from transformer.training import loop
from transformer.training.metrics import read_metrics

METRICS = ("acc", "acc_norm", "bits_per_byte", "docs")


def _config(corpus_dir: str, task_file: str, lr: float = 1e-3, seed: int = 0):
    c = lm.get_config("gpt2_tiny")
    c.data.data_dir, c.data.seq_len = corpus_dir, 32
    c.train.update(steps=4, batch_size=8, warmup_steps=1, log_every=2, eval_every=2, eval_steps=1, checkpoint_every=4,
                   learning_rate=lr, seed=seed)
    c.train.eval_tasks = f"toy={task_file}"
    return c


@pytest.mark.slow  # CI's 15 minutes: 17 s of the default run on 2 loaded cores (2026-11-27)
def test_tasks_are_scored_at_every_evaluation_as_the_command_scores_them(corpus_dir, tmp_path):
    task_file = write_task(str(tmp_path / "toy.jsonl"), docs=10)
    workdir = str(tmp_path / "run")
    summary = loop.train(_config(corpus_dir, task_file), workdir, verbose=False)
    assert summary["status"] == "ok" and list(summary["tasks"]) == ["toy"]
    rows = [r for r in read_metrics(workdir) if "eval_loss" in r]
    assert [r["step"] for r in rows] == [2, 4] and all(f"tasks/toy/{m}" in r for r in rows for m in METRICS)
    assert summary["tasks"]["toy"] == {m: rows[-1][f"tasks/toy/{m}"] for m in METRICS}
    alone = evaluate(workdir, f"toy={task_file}", batch_size=3)["tasks"]["toy"]
    assert alone["docs"] + alone["skipped_docs"] == 10 and summary["tasks"]["toy"]["docs"] == alone["docs"]
    for m in ("acc", "acc_norm"):
        assert summary["tasks"]["toy"][m] == alone[m], m
    assert summary["tasks"]["toy"]["bits_per_byte"] == pytest.approx(alone["bits_per_byte"], rel=1e-5)
    design = ("run_id", "budget", "params", "params_non_embedding", "size", "tokens", "flops", "flops_per_token",
              "steps", "batch_size", "seq_len", "learning_rate", "warmup_steps", *SHAPE_KEYS)
    row = result_row({k: 0 for k in design}, summary, "ok", None, 1.0, "test")  # a sweep's results row
    assert row["tasks"] == summary["tasks"] and row["eval_sets"] == {}


@pytest.mark.slow
def test_a_group_scores_each_run(corpus_dir, tmp_path):
    task_file = write_task(str(tmp_path / "toy.jsonl"), docs=10)
    configs = [_config(corpus_dir, task_file, lr, seed) for lr, seed in ((1e-3, 0), (1e-2, 1))]
    for c in configs:
        c.mesh.data = 1
    dirs = [str(tmp_path / f"g{r}") for r in range(2)]
    summaries = loop.train_runs(configs, dirs, verbose=False)
    for workdir, summary in zip(dirs, summaries):
        alone = evaluate(workdir, f"toy={task_file}", batch_size=8)["tasks"]["toy"]
        assert summary["tasks"]["toy"]["bits_per_byte"] == pytest.approx(alone["bits_per_byte"], rel=1e-5)
    assert summaries[0]["tasks"]["toy"]["bits_per_byte"] != summaries[1]["tasks"]["toy"]["bits_per_byte"]


def test_a_task_that_cannot_be_read_is_refused_before_anything_is_written(corpus_dir, tmp_path):
    workdir = str(tmp_path / "run")
    c = _config(corpus_dir, str(tmp_path / "missing.jsonl"))
    with pytest.raises(ConfigError, match="train.eval_tasks: 'toy=.*missing.jsonl': no such file"):
        loop.train(c, workdir, verbose=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"context": "x", "choices": ["a"], "label": 3}\n')
    with pytest.raises(ConfigError, match="'label' must be the index"):
        loop.train(_config(corpus_dir, str(bad)), workdir, verbose=False)
    c = _config(corpus_dir, str(bad))
    c.model.family, c.train.task = "encoder", "mlm"
    with pytest.raises(ConfigError, match="train.eval_tasks scores continuations with a decoder .* or an encoder"):
        loop.train(c, workdir, verbose=False)
    assert not os.path.exists(workdir)


def test_the_command_refuses_bad_input_in_one_line(tiny_lm_run, tmp_path):
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cases = ((f"--workdir={tmp_path}/none", f"--tasks=toy={write_task(str(tmp_path / 't.jsonl'))}", "does not exist"),
             (f"--workdir={tiny_lm_run}", "--tasks=toy=/no/such.jsonl", "no such file"))
    for *args, says in cases:
        done = subprocess.run([sys.executable, "-m", "experiments.evaluate", *args], cwd=repo, capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": repo})
        lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.returncode == 2 and len(lines) == 1 and says in lines[0], (args, done.stderr[-500:])
