"""One definition of a 95% interval (`scaling/interval.py`): every interval names its noise source and its
multiplier; none is of zero width. Issue 29, 1.7: an in-range --predict_points on a grid with no loss-noise
estimate (no seeds, no budget of 4 or more sizes: an over-training grid) got [L̂, L̂], marked calibrated."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from sweep_fixture import law as iso_law, g_coef, TRUE_A
from test_fit_points import law, overtraining_grid
from transformer.scaling import backtest, fits, interval, report
from transformer.scaling import points as points_lib


def test_an_interval_names_its_source_and_multiplier():
    ci = interval.Interval(1.0, 2.0, "seeds", 0.5)
    assert ci.fields("loss") == {"loss_ci95": [1.0, 2.0], "loss_ci95_source": "seeds"}
    assert interval.Interval(1.0, math.inf, "residuals+seeds").to_json() == [1.0, None]
    nothing = interval.none("no noise")
    assert nothing.to_json() is None and nothing.fields("x")["x_ci95_note"] == "no noise"
    for bad in (dict(source="guess"), dict(source="seeds+guess"), dict(lo=3.0), dict(multiplier=0.0),
                dict(lo=None)):
        with pytest.raises(ValueError):
            interval.Interval(**{"lo": 1.0, "hi": 2.0, "source": "seeds", **bad})
    with pytest.raises(TypeError):
        interval.Interval(1.0, 2.0)  # a source must be named
    drawn = interval.from_draws([1.0, None, float("nan"), 2.0, 3.0], "residuals")  # failed draws left out
    assert (drawn.lo, drawn.hi, drawn.source) == (1.0, 3.0, "residuals")  # 3 draws: the extremes
    assert interval.from_draws([1.0, None], "seeds") is None


def test_the_ends_of_k_draws_hold_a_new_draw_95_percent_of_the_time_at_any_k():
    """A bootstrap's percentile ends must hold a new draw of the same distribution 95% of the time however many
    draws there are: at K = 40 numpy's default percentile (rank q·(K − 1) + 1) holds only 90.4%."""
    rng = np.random.default_rng(0)
    for k in (40, 50, 200):
        draws_RK, fresh_R = rng.standard_normal((20000, k)), rng.standard_normal(20000)
        ends_R2 = np.array([interval.percentile_ends(d) for d in draws_RK])
        held = np.mean((ends_R2[:, 0] <= fresh_R) & (fresh_R <= ends_R2[:, 1]))
        assert abs(held - 0.95) < 0.006, (k, held)


def test_in_range_points_without_a_noise_estimate_get_a_residual_interval_not_a_point():
    """The over-training grid has no seeds and no budget of 4 sizes: no σ, no draws. A point inside the data
    gets an interval of positive width from the fitted form's residuals, which covers the truth, and says so."""
    pts = overtraining_grid()
    fit = fits.fit_all(pts, bootstrap=0, approach3_near=0, predict_points=[(1e8, 1e8 * 100), (1e9, 2e11)])
    assert fit["noise"]["sigma"] is None
    inside, beyond = fit["point_predictions"]["predictions"]
    for p in (inside, beyond):
        lo, hi = p["loss_ci95"]
        assert lo < p["loss"] < hi and lo <= law(p["params"], p["tokens"]) <= hi
    assert fit["noise"]["kind"] == "none"
    for p in (inside, beyond):
        assert p["loss_ci95_source"] == "fit_residuals" == p["loss_interval"]["source"]
        assert p["loss_interval"]["noise_sd_log"] > 0
    assert inside["loss_interval"]["distance"] == 0.0 and (hi - lo) / inside["loss"] > 0.002
    assert "the fit's residual RMS as noise" in report.summary(fit)
    json.dumps(fit, allow_nan=False)


def test_with_no_noise_at_all_an_interval_is_null_or_says_it_is_the_extrapolation_alone():
    inside, terms = backtest.frontier_interval(2.0, 0.0, np.log(16), None, "seeds")
    assert inside.to_json() is None and inside.source == "none" and "no interval" in inside.note
    assert not terms["calibrated"]
    beyond, terms = backtest.frontier_interval(2.0, np.log(4), np.log(16), 0.0, "residuals", spread=0.1)
    assert beyond.lo < 2.0 < beyond.hi and beyond.source == "none" and "extrapolation term alone" in beyond.note
    assert beyond.hi / 2.0 == pytest.approx(math.exp(0.1 * np.log(4) / np.log(16) ** backtest.SPAN_POWER))  # q·lever
    with_noise, terms = backtest.frontier_interval(2.0, 0.0, np.log(16), 0.01, "seeds")
    assert with_noise.source == "seeds" and terms["calibrated"]
    assert with_noise.hi / 2.0 == pytest.approx(math.exp(1.959964 * 0.01), rel=1e-5)


def three_size_grid(seed: int = 0) -> points_lib.Points:
    """6 budgets of 3 sizes each around their optimum (no seeds, no budget of 4 sizes: no loss-noise σ)."""
    rng = np.random.default_rng(seed)
    rows = []
    for c in np.geomspace(1e15, 1e15 * 2**5, 6):
        n_opt = g_coef() * (c / 6) ** TRUE_A
        for n in n_opt * np.array([0.4, 1.0, 2.5]):
            rows.append((n, c / (6 * n), float(iso_law(n, c / (6 * n)) * np.exp(rng.normal(0, 0.002)))))
    return points_lib.from_arrays(*zip(*rows), source="three sizes")


def test_frontier_predictions_without_a_noise_estimate_are_never_a_point():
    pts = three_size_grid()
    largest = float(pts.flops_P.max())
    fit = fits.fit_all(pts, predict_flops=[largest, 4 * largest])
    assert fit["noise"]["sigma"] is None and fit["frontier"]["law"] is not None
    for p in fit["predictions"]:
        lo, hi = p["loss_ci95"]
        assert lo < p["loss"] < hi
        assert p["loss_ci95_source"] == "fit_residuals"
    assert fit["predictions"][0]["loss_interval"]["distance"] == 0.0


def test_every_interval_in_a_fit_names_its_source():
    from sweep_fixture import write_sweep
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        write_sweep(d)
        fit = fits.fit_all(points_lib.read_sweep(d), bootstrap=10, predict_flops=[1e14])
    assert fit["noise"]["kind"] == "seeds"
    assert fit["approach2"]["ci95_source"] == "seeds" and fit["frontier"]["ci95_source"] == "seeds"
    p = fit["predictions"][0]
    assert p["loss_ci95_source"] == p["params_ci95_source"] == p["loss_noise_ci95_source"] == "seeds"
    assert isinstance(p["loss_ci95"], list) and p["loss_interval"]["spread"] == backtest.FRONTIER_SPREAD


def test_the_backtest_misfit_scale_pools_the_refits_with_the_prior():
    """Two refits (k = 3, 4) with e/x = 0.02 and 0.04 (the k = 2 and x = 0 pairs left out): s² pools their mean
    square with PRIOR_ORIGINS pseudo-refits at PRIOR_PER_EFOLD; the record describes the backtest only (no t or
    multiplier: the frontier's interval is `frontier_interval`'s, not built on this scale)."""
    pairs = [{"k": 3, "distance": 1.0, "log_error": 0.02}, {"k": 4, "distance": 0.5, "log_error": -0.02},
             {"k": 2, "distance": 1.0, "log_error": 0.5}, {"k": 4, "distance": 0.0, "log_error": 0.5}]
    scale = backtest.misfit_scale(pairs)
    s_bt2 = (0.02**2 + 0.04**2) / 2
    n0, s0 = backtest.PRIOR_ORIGINS, backtest.PRIOR_PER_EFOLD
    assert scale["backtest_per_efold"] == pytest.approx(math.sqrt(s_bt2))
    assert scale["per_efold"] == pytest.approx(math.sqrt((n0 * s0**2 + 2 * s_bt2) / (n0 + 2)))
    assert (scale["origins"], scale["pairs"], scale["min_origin"]) == (2, 2, backtest.MIN_BUDGETS)
    assert set(scale) == {"per_efold", "backtest_per_efold", "origins", "pairs", "min_origin"}
