"""`experiments.fit --sweep=DIR --metric=KEY` (issue 32 §4): any metric a sweep's runs recorded — a named set's or a
task's bits per byte (results rows' `eval_sets` / `tasks`) — is fitted in place of eval_loss, and fit.json says which."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from sweep_fixture import write_sweep

from transformer.scaling import points as points_lib
from transformer.scaling import report
from transformer.spec import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _sweep_with_metrics(root: str) -> list[dict]:
    """The fixture's sweep, each row with a named set (0.8 × eval_loss) and a task (1.5 × eval_loss); the last
    row's task unscored (null)."""
    rows = write_sweep(root, budgets=(1e12, 3e12, 1e13), seeds=1)
    for r in rows:
        r["eval_sets"] = {"wiki": {"loss": r["eval_loss"], "bits_per_byte": 0.8 * r["eval_loss"]}}
        r["tasks"] = {"toy": {"acc": 0.25, "bits_per_byte": 1.5 * r["eval_loss"]}}
    rows[-1]["tasks"]["toy"]["bits_per_byte"] = None
    with open(os.path.join(root, "results.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return rows


def test_a_recorded_metric_is_fitted_in_place_of_the_loss(tmp_path):
    rows = _sweep_with_metrics(str(tmp_path))
    loss = points_lib.read_sweep(str(tmp_path))
    wiki = points_lib.read_sweep(str(tmp_path), metric="eval/wiki/bits_per_byte")
    assert wiki.metric == "eval/wiki/bits_per_byte" and wiki.ids == loss.ids
    np.testing.assert_allclose(wiki.loss_P, 0.8 * loss.loss_P)
    toy = points_lib.read_sweep(str(tmp_path), metric="tasks/toy/bits_per_byte")
    assert len(toy) == len(rows) - 1 and any(e["id"] == rows[-1]["run_id"] and "is not finite" in e["reason"]
                                             for e in toy.excluded)
    fit_loss = report.run_fit(loss, str(tmp_path / "fit_loss"), make_plots=False)
    fit_wiki = report.run_fit(wiki, str(tmp_path / "fit_wiki"), make_plots=False)
    assert fit_wiki["metric"] == "eval/wiki/bits_per_byte" and fit_loss["metric"] == "eval_loss"
    assert fit_wiki["approach2"]["a"] == pytest.approx(fit_loss["approach2"]["a"], rel=1e-6)  # a scaled loss: same N_opt
    with pytest.raises(ConfigError, match="--metric=tasks/nope/bits_per_byte: no run .* records it; recorded: "
                                          ".*eval/wiki/bits_per_byte.*tasks/toy/acc"):
        points_lib.read_sweep(str(tmp_path), metric="tasks/nope/bits_per_byte")


def test_the_command_fits_a_metric_and_refuses_it_for_a_csv(tmp_path):
    _sweep_with_metrics(str(tmp_path / "sweep"))
    out = tmp_path / "fit"
    env = {**os.environ, "PYTHONPATH": REPO}
    done = subprocess.run([sys.executable, "-m", "experiments.fit", f"--sweep={tmp_path / 'sweep'}", f"--out={out}",
                           "--metric=tasks/toy/bits_per_byte", "--bootstrap=0"], cwd=REPO, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "fit.json").read_text())["metric"] == "tasks/toy/bits_per_byte"
    (tmp_path / "p.csv").write_text("params,tokens,loss\n1,2,3\n")
    refused = subprocess.run([sys.executable, "-m", "experiments.fit", f"--points={tmp_path / 'p.csv'}",
                              f"--out={tmp_path / 'o'}", "--metric=eval_bits_per_byte"], cwd=REPO, env=env,
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "--metric picks what a sweep's runs recorded" in refused.stderr


def _sweep_with_accuracy(root: str) -> list[dict]:
    """_sweep_with_metrics' sweep whose task accuracy is a known sigmoid of its bits per byte (plus noise)."""
    from transformer.scaling import two_step

    rows = _sweep_with_metrics(root)
    truth = {"floor": 0.25, "height": 0.5, "k": 8.0, "x0": 4.2}
    rng = np.random.default_rng(0)
    for r in rows:
        x = r["tasks"]["toy"]["bits_per_byte"]
        r["tasks"]["toy"]["acc"] = None if x is None else float(two_step.accuracy_at(truth, x) + rng.normal(0, 0.003))
    with open(os.path.join(root, "results.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return rows


def test_the_two_step_sigmoid_recovers_its_law(tmp_path):
    from transformer.scaling import two_step

    rows = _sweep_with_accuracy(str(tmp_path / "sweep"))
    x_P, acc_P = two_step.pairs(str(tmp_path / "sweep"), "tasks/toy/bits_per_byte", "tasks/toy/acc")
    assert len(x_P) == len(rows) - 1 and np.ptp(x_P) > 0.8
    sig = two_step.fit_sigmoid(x_P, acc_P)
    assert sig["floor"] == pytest.approx(0.25, abs=0.03) and sig["x0"] == pytest.approx(4.2, abs=0.1)
    with pytest.raises(ConfigError, match="at least 6"):
        two_step.fit_sigmoid(x_P[:3], acc_P[:3])


@pytest.mark.slow
def test_the_two_step_law_maps_the_predicted_bits_per_byte_to_accuracy(tmp_path):
    """Each prediction's accuracy is the sigmoid at the predicted bits per byte, its interval the mapped one."""
    from transformer.scaling import two_step

    _sweep_with_accuracy(str(tmp_path / "sweep"))
    out = tmp_path / "fit"
    done = subprocess.run([sys.executable, "-m", "experiments.fit", f"--sweep={tmp_path / 'sweep'}", f"--out={out}",
                           "--metric=tasks/toy/bits_per_byte", "--accuracy_metric=tasks/toy/acc", "--bootstrap=50",
                           "--predict_flops=3e13"], cwd=REPO, env={**os.environ, "PYTHONPATH": REPO},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    fit = json.loads((out / "fit.json").read_text())
    (p,) = fit["two_step"]["predictions"]
    assert p["accuracy"] == pytest.approx(float(two_step.accuracy_at(fit["two_step"]["sigmoid"], p["bits_per_byte"])))
    lo, hi = p["accuracy_ci95"]
    assert lo <= p["accuracy"] <= hi and "two-step law" in done.stdout
