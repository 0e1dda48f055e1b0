"""The frontier's loss predictions alone: approach 2's minima, their noise draws, the frontier with its backtest
and calibrated intervals, without the rest of `fits.fit_all` (approach 1, approach 3's bootstrap, conventions).

`experiments.reproduce` backtests many published settings with it; it takes the same route as `fits.fit_all`
(`frontier.with_predictions`), so it gives the same predictions (approach 3's E draws aside: without them each
frontier noise draw tests approach 3's point E, `frontier._drawn_laws`).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from transformer.scaling import fits, frontier, interval, noise, refits
from transformer.scaling.points import Points


def frontier_predictions(points: Points, predict_flops: Sequence[float], samples: int = 200,
                         seed: int = 0) -> dict[str, Any]:
    """{"frontier", "predictions", "noise"} for `points` (the fit.json keys of the same names, the frontier with its
    leave-one-budget-out "sensitivity"), with approach 3 (on the points near an optimum, `fits.APPROACH3_NEAR`)
    fitted for its E, and refitted per backtest origin."""
    points = points.canonical()
    rng = np.random.default_rng(seed)
    sigma = noise.estimate(points)
    a2 = fits.approach2(points)
    draws2 = None
    if sigma["sigma"] and a2.get("a") is not None and samples:
        draws2 = fits.approach2_draws(a2, sigma["sigma"], samples, rng)
    a3, chosen = fits.approach3_near_optimum(points, a2, fits.APPROACH3_NEAR, sigma["sigma"])
    front, preds = frontier.with_predictions(a2, draws2, a3, predict_flops, interval.noise_kind(sigma),
                                             refits.backtest_e(chosen, a2, a3))
    stability = refits.leave_one_budget_out(chosen, a2, a3, front, predict_flops)
    if stability is not None:
        front["sensitivity"] = stability
    return {"frontier": front, "predictions": preds, "noise": sigma}
