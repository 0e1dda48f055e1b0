"""A grid whose budgets have no interior minimum (the loss falls monotonically with N at every budget, as when the
learning rate is far too small): the fit writes what it can (fit.json, every figure, each saying what it cannot
draw) and the documented "cannot predict" note, through report.run_fit, experiments.fit and a sweep's prediction
step (issue 29, 2.1)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from sweep_fixture import shape
from transformer.scaling import points as points_lib, report
from transformer.sweeps import outcome

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGETS = (1e15, 3e15, 1e16)
SIZES = (1e5, 2e5, 4e5)
FIGURES = ["isoflops.png", "optimal_scaling.png", "loss_frontier.png"]


def monotone_loss(n: float, c: float) -> float:
    """Falls with N at every budget, rises a little with C: no interior minimum, no compute-optimal allocation."""
    return 5.5 - 0.02 * np.log(n) + 0.001 * np.log(c / 1e15)


def monotone_points() -> points_lib.Points:
    rows = [(n, c / (6 * n), monotone_loss(n, c)) for c in BUDGETS for n in SIZES]
    return points_lib.from_arrays(*zip(*rows), source="monotone")


def check_cannot_predict(fit: dict, out) -> None:
    assert fit["approach2"]["a"] is None and fit["frontier"]["law"] is None
    pred = fit["predictions"][0]
    assert pred["loss"] is None and "no frontier" in pred["note"]
    saved = json.loads((out / "fit.json").read_text())
    assert saved["predictions"][0]["note"] == pred["note"]
    assert set(FIGURES) <= set(os.listdir(out))


def test_run_fit_writes_the_fit_and_figures_without_interior_minima(tmp_path):
    fit = report.run_fit(monotone_points(), str(tmp_path), predict_flops=[4e16])
    check_cannot_predict(fit, tmp_path)
    assert fit["figures"] and set(FIGURES) <= set(fit["figures"])


def test_experiments_fit_without_interior_minima(tmp_path):
    csv = tmp_path / "points.csv"
    csv.write_text("params,tokens,loss\n" + "".join(f"{n},{c / (6 * n)},{monotone_loss(n, c)}\n"
                                                   for c in BUDGETS for n in SIZES))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "experiments.fit", f"--points={csv}", f"--out={out}",
                           "--predict_flops=4e16", "--bootstrap=0"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_cannot_predict(json.loads((out / "fit.json").read_text()), out)
    assert "loss n/a" in proc.stdout


def test_a_sweeps_prediction_step_writes_the_cannot_predict_note(tmp_path):
    """outcome.predict (the sweep's step before its validation run) on such a grid: predictions.json with params
    and loss null and the note, every time it is asked (a rerun reads it back)."""
    rows = []
    for budget in BUDGETS:
        for d in (16, 32, 64):
            s = shape(d)
            tokens = budget / s["flops_per_token"]
            rows.append({"run_id": f"C{budget:.0e}-d{d}", "status": "ok", "budget": budget, "tokens": tokens,
                         "flops": budget, "eval_loss": float(monotone_loss(s["params"], budget)), "seed": 0, **s})
    with open(tmp_path / "results.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    doc = {"sweep": {"param_count": "total", "validate_flops": 4e16, "fit_bootstrap": 0}}
    prediction = outcome.predict(str(tmp_path), doc)
    assert prediction["params"] is None and prediction["loss"] is None
    assert "cannot predict" in prediction["note"]
    assert outcome.predict(str(tmp_path), doc) == prediction
    assert set(FIGURES) <= set(os.listdir(tmp_path / "fit"))
