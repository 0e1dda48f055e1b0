"""Loss at any (N, D) (approach 3, intervals calibrated on a backtest by model size) on an over-training grid:
a model family trained at several token counts each, predicted at a larger model and more tokens."""
from __future__ import annotations

import numpy as np
import pytest

from transformer.spec import ConfigError
from transformer.scaling import at_points, fits, report
from transformer.scaling import points as points_lib

E, A, B, ALPHA, BETA = 1.8, 400.0, 2000.0, 0.34, 0.37


def law(n, d):
    return E + A / n**ALPHA + B / d**BETA


def overtraining_grid(seed: int = 0) -> points_lib.Points:
    """6 sizes × 5 token counts (20–640 tokens per parameter), 0.3% noise."""
    rng = np.random.default_rng(seed)
    n = np.repeat(np.geomspace(1e7, 3.2e8, 6), 5)
    d = n * np.tile([20, 40, 80, 160, 640], 6)
    loss = law(n, d) * np.exp(rng.normal(0, 0.003, len(n)))
    return points_lib.from_arrays(n, d, loss)


def test_parse_points_and_errors():
    assert at_points.parse(["1e9:2e10", "5e8:1e11"]) == [(1e9, 2e10), (5e8, 1e11)]
    for bad in ("1e9", "1e9:x", "-1:5", "1e9:0"):
        with pytest.raises(ConfigError, match="--predict_points"):
            at_points.parse([bad])


def test_loss_at_points_with_calibrated_interval(tmp_path):
    pts = overtraining_grid()
    asked = [(1e9, 1e9 * 200), (3.2e8, 3.2e8 * 1000)]
    fit = fits.fit_all(pts, bootstrap=12, approach3_near=0, predict_points=asked)
    out = fit["point_predictions"]
    assert out["backtest"]["pairs"] and out["backtest"]["misfit_per_efold"] is not None
    for p, (n, d) in zip(out["predictions"], asked):
        truth = law(n, d)
        assert p["loss"] == pytest.approx(truth, rel=0.01)
        assert p["loss_ci95"][0] <= truth <= p["loss_ci95"][1]
        assert p["loss_interval"]["calibrated"]
    text = report.summary(fit)
    assert "loss at N = 1e+09, D = 2e+11" in text and "backtest by model size" in text
