"""The sweep's prediction check of a task's and a named set's metric (sweep.predict_metrics, issue 32 §4): the
names checked where the sweep's settings are (one error listing the metrics the runs record, before anything is
written); each metric predicted with the loss in DIR/fit/predictions.json before the validation run trains, then
checked against that run in validation.json, fitted into DIR/fit/metrics/, and said on the console. Training is
replaced by rows of a known law (tests/test_sweep_plan.py) through the real runner; the end-to-end run of the
command is the slow test at the end."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from test_sweep_plan import _config, _loss
from test_task_scoring import write_task
from transformer.design.spec import SweepSpec
from transformer.scaling import plots
from transformer.spec import ConfigError
from transformer.sweeps import execute, outcome, runner
from xla_env import xla_flags

TASK, SET = "tasks/toy/bits_per_byte", "eval/own/bits_per_byte"


def _with_metrics(task_file: str, predict_metrics, **sweep):
    settings = dict(budgets=(1e11, 2e11, 4e11), sizes_per_budget=4, recenter=True, validate_flops=1.6e12,
                    fit_bootstrap=4, predict_metrics=predict_metrics)
    c = _config(**{**settings, **sweep})
    c.base.train.eval_tasks = f"toy={task_file}"
    c.base.data.eval_sets = "own=heldout"
    return c


def _task_bpb(loss: float) -> float:
    """The task's correct-answer bits per byte as the law makes it: affine in the loss (so a frontier of it too)."""
    return 0.6 * loss - 0.2


def test_the_metric_names_are_checked_with_the_sweeps_settings(tmp_path):
    task_file = write_task(str(tmp_path / "toy.jsonl"), docs=4)
    spec = SweepSpec.of(_with_metrics(task_file, f" {TASK}, {SET},{TASK}"))
    assert spec.predict_metrics == f"{TASK},{SET}"  # spaces and repeats dropped: one recorded form
    plain = lambda value: {"sweep": {**_with_metrics(task_file, "").sweep.to_dict(), "predict_metrics": value},
                           "base": _with_metrics(task_file, "").base.to_dict()}
    assert SweepSpec.of(plain([SET])).predict_metrics == SET  # a plain-dict config's list
    workdir = tmp_path / "sweep"
    for value, says in (("tasks/toy/acc", "'tasks/toy/acc' is not a metric this sweep's runs record; valid: "
                                          "eval_bits_per_byte, eval/own/bits_per_byte, eval/own/loss, "
                                          "tasks/toy/bits_per_byte"),
                        ("tasks/other/bits_per_byte", "experiments.fit --accuracy_metric")):
        with pytest.raises(ConfigError, match=says):
            runner.run_sweep(str(workdir), _with_metrics(task_file, value))
    with pytest.raises(ConfigError, match="set sweep.validate_flops"):
        runner.run_sweep(str(workdir), _with_metrics(task_file, TASK, validate_flops=0.0))
    with pytest.raises(ConfigError, match="predict_metrics=3 must be metric names"):
        SweepSpec.of(plain(3))
    assert not workdir.exists()  # refused before anything is written


def test_each_metric_is_predicted_before_the_validation_run_trains_then_checked(tmp_path, monkeypatch, capsys):
    task_file = write_task(str(tmp_path / "toy.jsonl"), docs=4)
    workdir, rng, seen = str(tmp_path / "sweep"), np.random.default_rng(0), {}

    def train_run(workdir, run, mode, verbose=False, max_retries=0):
        loss = _loss(run, rng)
        if run["role"] == "validate":  # what the prediction said before this run trained
            seen["prediction"] = json.load(open(os.path.join(workdir, "fit", "predictions.json")))
            seen["validated"] = os.path.exists(os.path.join(workdir, "fit", "validation.json"))
        summary = {"status": "ok", "eval_loss": loss, "wall_seconds": 1.0,
                   "tasks": {"toy": {"acc": 0.25, "acc_norm": 0.25, "bits_per_byte": _task_bpb(loss), "docs": 4}},
                   "eval_sets": {"own": {"loss": loss, "bits_per_byte": loss / math.log(2) * 0.9}}}
        return execute.record(workdir, run, summary, mode)

    monkeypatch.setattr(runner, "train_run", train_run)
    monkeypatch.setattr(plots, "write_all", lambda fit, out_dir: [  # the figure checked here only: seconds less
        plots.plot_frontier(fit, os.path.join(out_dir, "loss_frontier.png"))])
    code, doc = runner.run_sweep(workdir, _with_metrics(task_file, TASK))  # the set's metric: the slow test's
    assert code == 0 and doc["sweep"]["predict_metrics"] == TASK
    before, validated = seen["prediction"], seen["validated"]
    assert not validated and list(before["metrics"]) == [TASK]
    pred = before["metrics"][TASK]
    lo, hi = pred["value_ci95"]
    assert pred["flops"] == pytest.approx(1.6e12) and lo < pred["value"] < hi and pred["value_ci95_source"]
    assert pred["fit"] == os.path.join("fit", "metrics", "tasks_toy_bits_per_byte")
    assert before["metrics"][TASK]["value"] == pytest.approx(_task_bpb(before["loss"]), rel=0.02)
    out = capsys.readouterr().out
    assert f"prediction of {TASK} at 1.6e+12 FLOPs: {before['metrics'][TASK]['value']:.4f}" in out

    fit = outcome.finish(workdir, runner.load_sweep(workdir))
    checked = json.load(open(os.path.join(workdir, "fit", "validation.json")))
    assert fit["validation"] == checked and set(checked["metrics"]) == {TASK}
    row = next(r for r in execute.read_rows(workdir) if r["role"] == "validate")
    task_check = checked["metrics"][TASK]
    assert task_check["measured"] == row["tasks"]["toy"]["bits_per_byte"]
    assert task_check["predicted"] == before["metrics"][TASK]["value"]
    assert task_check["relative_error"] == pytest.approx(
        (task_check["measured"] - task_check["predicted"]) / task_check["predicted"])
    assert abs(task_check["relative_error"]) < 0.03 and task_check["inside_ci95"] is not None
    lo, hi = task_check["predicted_ci95"]
    assert task_check["inside_ci95"] == (lo <= task_check["measured"] <= hi)
    assert task_check["params"] == row["params"] and task_check["predicted_params"] > 0
    folder = os.path.join(workdir, "fit", "metrics", "tasks_toy_bits_per_byte")
    metric_fit = json.load(open(os.path.join(folder, "fit.json")))
    assert metric_fit["metric"] == TASK and metric_fit["validation"]["measured_loss"] == task_check["measured"]
    loss_fit = json.load(open(os.path.join(workdir, "fit", "fit.json")))  # the metric fitted as the loss is
    assert (metric_fit["n_kind"], len(metric_fit["points"])) == (loss_fit["n_kind"], len(loss_fit["points"]))
    assert os.path.exists(os.path.join(folder, "loss_frontier.png")) and fit["metric_fits"] == {
        TASK: os.path.join("fit", "metrics", "tasks_toy_bits_per_byte")}
    out = capsys.readouterr().out
    line = next(s for s in out.splitlines() if s.startswith(f"prediction check of {TASK} at 1.6e+12 FLOPs"))
    assert f"measured {task_check['measured']:.4f}" in line and "95% interval" in line
    assert line in outcome.summary_lines(fit)  # and in the command's end summary


def test_a_metric_that_cannot_be_predicted_is_recorded_and_not_checked():
    """A metric whose fit gave no value: its check carries the note and no verdict, and says nothing on the console;
    a prediction interval with a missing end checks nothing either (the loss's check reads the same rule)."""
    from transformer.sweeps import metric_check

    row = {"status": "ok", "flops": 8e11, "params": 1000, "tasks": {"toy": {"bits_per_byte": 1.2}}}
    prediction = {"metrics": {TASK: {"flops": 8e11, "value": None, "note": "no frontier"}}}
    checked = metric_check.validation(row, prediction)[TASK]
    assert checked["measured"] == 1.2 and checked["predicted"] is None and checked["note"] == "no frontier"
    assert checked["relative_error"] is None and checked["inside_ci95"] is None
    assert metric_check.validation_lines({"metrics": {TASK: checked}}) == []
    assert metric_check.compare(1.2, 1.0, [None, 1.3]) == {"relative_error": pytest.approx(0.2), "inside_ci95": None}
    assert metric_check.compare(1.2, 1.0, [1.1, 1.3])["inside_ci95"] is True
    assert metric_check.verdict(False) == "OUTSIDE its 95% interval"


CONFIG = '''from configs.sweeps import quick


def get_config():
    """The quick sweep with the law's grid of tests/test_sweep_plan.py, a task and a set, and the metric check."""
    c = quick.get_config()
    c.sweep.update(dict(budgets=(1e11, 2e11, 4e11), d_models=tuple(range(8, 257, 8)), sizes_per_budget=4,
                        size_span=6.0, prior_tokens_per_param=100.0, recenter=False, branch=False,
                        lr_coefficient=0.2, lr_exponent=-0.5, lr_max=1.0, min_steps=5, validate_ratio=0.0,
                        validate_flops=8e11, fit_bootstrap=8, evals_per_run=1,
                        predict_metrics="{task},{set}"))
    c.base.data.data_dir = "{data_dir}"
    c.base.train.schedule = "cosine"
    c.base.train.eval_steps = 4
    c.base.train.eval_tasks = "toy={task_file}"
    c.base.data.eval_sets = "own=heldout"
    return c
'''


@pytest.mark.slow
def test_the_command_predicts_the_metrics_then_trains_the_validation_run_and_checks_them(tmp_path, corpus_dir):
    """The command end to end from a recorded grid (the law's rows, as the runner records them: training the grid
    for real gives no frontier in a test's minutes): it fits the loss and both metrics, writes and prints their
    predictions, then trains the validation run for real — scoring the task and the set in its loop — and checks
    each metric against what that run measured."""
    import importlib.util
    import subprocess
    import sys

    from transformer.sweeps import results

    task_file = write_task(str(tmp_path / "toy.jsonl"), docs=12)
    path = tmp_path / "metric_sweep.py"
    path.write_text(CONFIG.format(task=TASK, set=SET, data_dir=corpus_dir, task_file=task_file))
    spec = importlib.util.spec_from_file_location("metric_sweep", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    workdir, rng = str(tmp_path / "sweep"), np.random.default_rng(0)
    _, doc = runner.plan_and_write(workdir, module.get_config())  # the grid, recorded from the law
    for run in doc["runs"]:
        loss = _loss(run, rng)
        execute.record(workdir, run, {"status": "ok", "eval_loss": loss, "wall_seconds": 1.0,
                                      "tasks": {"toy": {"bits_per_byte": _task_bpb(loss)}},
                                      "eval_sets": {"own": {"bits_per_byte": loss / math.log(2)}}}, "isoflop")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu",
               PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "experiments.sweep", f"--config={path}", f"--workdir={workdir}"],
                         cwd=repo, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    predicted = [i for i, s in enumerate(lines) if s.startswith(f"prediction of {TASK} at 8e+11 FLOPs: ")]
    started = [i for i, s in enumerate(lines) if "start " in s and "-validate-" in s]
    assert predicted and started and predicted[0] < started[0], out.stdout[-3000:]  # said before it trained
    prediction = json.load(open(os.path.join(workdir, "fit", "predictions.json")))
    row = next(r for r in results.read_results(workdir) if r["role"] == "validate")
    assert row["status"] == "ok" and set(row["tasks"]) == {"toy"} and set(row["eval_sets"]) == {"own"}
    summary_dir = os.path.join(workdir, "runs", row["run_id"])
    assert os.stat(os.path.join(workdir, "fit", "predictions.json")).st_mtime <= \
        os.stat(os.path.join(summary_dir, "config.json")).st_mtime  # written before the run began
    checked = json.load(open(os.path.join(workdir, "fit", "validation.json")))["metrics"]
    for metric, measured in ((TASK, row["tasks"]["toy"]["bits_per_byte"]), (SET, row["eval_sets"]["own"]["bits_per_byte"])):
        assert checked[metric]["predicted"] == prediction["metrics"][metric]["value"] is not None
        assert checked[metric]["measured"] == measured and checked[metric]["params"] == row["params"]
        assert any(s.startswith(f"prediction check of {metric} at 8e+11 FLOPs: predicted ") and
                   f"measured {measured:.4f}" in s for s in lines), metric
        assert os.path.exists(os.path.join(workdir, "fit", "metrics", metric.replace("/", "_"), "loss_frontier.png"))
