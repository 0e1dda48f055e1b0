"""The frontier's loss predictions alone: approach 2's minima, their noise draws, the frontier with its backtest
and calibrated intervals, without the rest of `fits.fit_all` (approach 1, approach 3's bootstrap, conventions).

`experiments.reproduce` backtests many published settings with it; `fits.fit_all` gives the same predictions
(approach 3's E draws aside, where the minima do not pin E).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from transformer.scaling import fits, frontier, noise
from transformer.scaling.points import Points


def frontier_predictions(points: Points, predict_flops: Sequence[float], samples: int = 200,
                         seed: int = 0) -> dict[str, Any]:
    """{"frontier", "predictions", "noise"} for `points` (the fit.json keys of the same names); approach 3 is fitted
    only where the minima do not pin E down."""
    points = points.canonical()
    rng = np.random.default_rng(seed)
    sigma = noise.estimate(points)
    a2 = fits.approach2(points)
    draws2 = None
    if sigma["sigma"] and a2.get("a") is not None and samples:
        draws2 = fits.approach2_draws(a2, sigma["sigma"], samples, rng)
    a3: dict[str, Any] = {}
    loss_B = [b["loss_opt"] for b in a2.get("budgets", [])]
    law = frontier.fit_largest([b["C_opt"] for b in a2.get("budgets", [])], loss_B) if loss_B else None
    if loss_B and (law is None or law["E"] < frontier.E_UNIDENTIFIED * min(loss_B)):
        a3, _ = fits._approach3_near(points, a2, fits.APPROACH3_NEAR, sigma["sigma"])
    front = fits._frontier(a2, draws2, a3)
    preds = frontier.predictions(predict_flops, a2, front.get("law"), front.pop("_draws", None),
                                 front.pop("_calibration", None))
    return {"frontier": front, "predictions": preds, "noise": sigma}
