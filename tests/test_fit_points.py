"""Loss at any (N, D) (approach 3, intervals calibrated on a backtest by model size) on an over-training grid:
a model family trained at several token counts each, predicted at a larger model and more tokens."""
from __future__ import annotations

import numpy as np
import pytest

from transformer.spec import ConfigError
from transformer.scaling import at_points, fits, overtrain, report
from transformer.scaling import points as points_lib
from cli_modules import cli_module

E, A, B, ALPHA, BETA = 1.8, 400.0, 2000.0, 0.34, 0.37


def law(n, d):
    return E + A / n**ALPHA + B / d**BETA


def overtraining_grid(seed: int = 0, noise: float = 0.003) -> points_lib.Points:
    """6 sizes × 5 token counts (20–640 tokens per parameter), `noise` (0.3%) lognormal noise."""
    rng = np.random.default_rng(seed)
    n = np.repeat(np.geomspace(1e7, 3.2e8, 6), 5)
    d = n * np.tile([20, 40, 80, 160, 640], 6)
    loss = law(n, d) * np.exp(rng.normal(0, noise, len(n)))
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


GADRE = {"E": 1.9, "a": 40.0, "b": 900.0, "eta": 0.16}  # L(C, M) = E + (a·M^η + b·M^-η)·C^-η


def gadre_grid(seed: int, sizes: int = 6) -> points_lib.Points:
    """Gadre et al.-style grid from their form: `sizes` small models, each trained at 10–320 tokens per parameter,
    0.3% noise."""
    rng = np.random.default_rng(seed)
    n = np.repeat(np.geomspace(1e7, 3.2e8, sizes), 6)
    d = n * np.tile([10, 20, 40, 80, 160, 320], sizes)
    m, c = d / n, 6 * n * d
    loss = GADRE["E"] + (GADRE["a"] * m ** GADRE["eta"] + GADRE["b"] * m ** -GADRE["eta"]) * c ** -GADRE["eta"]
    return points_lib.from_arrays(n, d, loss * np.exp(rng.normal(0, 0.003, len(n))))


def test_overtrain_form_recovers_its_law_and_rejects_too_few_points():
    exact = gadre_grid(0)
    truth_P = gadre_grid(0).loss_P / np.exp(np.random.default_rng(0).normal(0, 0.003, len(exact)))
    fit = overtrain.fit(exact.params_P, exact.tokens_P, truth_P)
    for key, value in GADRE.items():
        assert fit[key] == pytest.approx(value, rel=1e-4), (key, fit)
    with pytest.raises(ConfigError, match="at least 4 points"):
        overtrain.fit(exact.params_P[:3], exact.tokens_P[:3], truth_P[:3])


def test_points_use_the_form_that_wins_the_backtest():
    """Approach 3 nests the over-training form (α = β = 2η), so on grids drawn from Gadre et al.'s form both describe
    the points; the backtest picks the over-training form, the law they are drawn from, on all 5 (2 of 5 before approach
    3's refits started from the profile grid: they started from the fit to all the points and L-BFGS-B stopped short
    of the refit's optimum, which leaked the held-out points into approach 3's backtest, median |error| 0.13–0.32%
    against 0.31–0.68% at the refits' own optima). Whichever predicts,
    a 1e9-parameter model at 500 tokens per parameter (3× the largest size) is within 1% and inside its interval,
    and the over-training form's own fit predicts it within 0.5%. On approach 3's law with α ≠ β (the grid above)
    the over-training form misfits, loses the backtest, and approach 3 predicts. fit.json and the console say which."""
    asked = [(1e9, 5e11)]
    truth = overtrain.loss_at(GADRE, 1e9, 5e11)
    chosen = []
    for seed in range(5):
        fit = fits.fit_all(gadre_grid(seed), bootstrap=8, approach3_near=0, predict_points=asked, seed=seed)
        out = fit["point_predictions"]
        chosen.append(out["chosen"])
        p = out["predictions"][0]
        assert p["loss"] == pytest.approx(truth, rel=0.01)
        assert p["loss_ci95"][0] <= truth <= p["loss_ci95"][1]
        assert overtrain.loss_at(out["candidates"]["overtrain"]["law"], 1e9, 5e11) == pytest.approx(truth, rel=0.005)
        if out["chosen"] == "overtrain":
            assert p["loss"] == overtrain.loss_at(out["candidates"]["overtrain"]["law"], 1e9, 5e11)
            text = report.summary(fit)
            assert "loss at (N, D) from overtrain" in text and "chosen by the backtest" in text
    assert chosen.count("overtrain") >= 4, chosen
    # The over-training form misses approach 3's law (α ≠ β) by ~0.4% in backtest; at 0.3% noise the two forms'
    # backtest errors are both near the noise (0.0034 vs 0.0047 on one Xeon, another order elsewhere), so the loser is
    # shown where the noise (0.05%) is well below that misfit: there the margin is 3.8x, not a floating-point accident.
    other = fits.fit_all(overtraining_grid(noise=0.0005), bootstrap=8, approach3_near=0,
                         predict_points=asked)["point_predictions"]
    assert other["chosen"] == "approach3", other["candidates"]
    assert other["candidates"]["overtrain"]["backtest_median_abs_error"] > 2 * other["candidates"]["approach3"][
        "backtest_median_abs_error"]


def test_interval_is_calibrated_on_published_size_holdouts():
    """Porian et al.'s five OpenWebText2 settings (shipped), refitted on the sizes ≤ N_max/2 and ≤ N_max/4, predict
    every point of the larger sizes (`experiments.reproduce_points`): the interval with the shipped multiplier
    covers ≥ 90% of the held-out points (each setting and case weighted equally; with m = 1 it covered 79%, so
    an uncalibrated interval fails here), and is not wider than needed: its median log half-width is below 1.2×
    the 95% quantile of |ln(L̂/L)| (0.8× with the shipped m; 1.5× with m = 5)."""
    reproduce, reproduce_points = cli_module("reproduce"), cli_module("reproduce_points")

    cases = [c for row, pts in reproduce.porian_settings() if row["dataset"] == "OpenWebText2"
             for c in reproduce_points.size_holdout(row["experiment"], pts, samples=8)]
    assert len(cases) == 10 and all("points" in c for c in cases), [c.get("note") for c in cases]
    covered, halves, log_errors = [], [], []
    for c in cases:
        hits = []
        for p in c["points"]:
            lo, hi = p["ci95"]
            hits.append(lo <= p["truth"] <= hi)
            halves.append(np.log(hi / lo) / 2)
            log_errors.append(abs(np.log(p["predicted"] / p["truth"])))
        covered.append(np.mean(hits))
    assert np.mean(covered) >= 0.9, covered
    assert np.median(halves) < 1.2 * np.quantile(log_errors, 0.95), (np.median(halves), np.quantile(log_errors, 0.95))


def test_size_backtest_refits_do_not_see_the_held_out_points():
    """Each refit of the size backtest knows only its own points: changing the losses of the largest size (which no
    refit uses, by 0.2%) leaves every backtest prediction as it was. Before, approach 3's refits started from the fit to all
    the points and L-BFGS-B stopped short of their own optimum, so the held-out points moved the predictions."""
    pts = overtraining_grid(noise=0.0005).canonical()
    largest = pts.params_P == pts.params_P.max()
    moved = points_lib.from_arrays(pts.params_P, pts.tokens_P, pts.loss_P * np.where(largest, 1.002, 1.0))
    runs = [at_points.predict(p, fits.approach3(p), [(1e9, 1e11)]) for p in (pts, moved)]
    assert [r["chosen"] for r in runs] == ["approach3", "approach3"]
    pairs = [[(q["params"], q["tokens"], q["predicted"]) for q in r["backtest"]["pairs"]] for r in runs]
    assert len(pairs[0]) > 0
    assert pairs[0] == pairs[1]
