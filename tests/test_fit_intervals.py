"""Calibrated loss intervals, measured over many simulated sweeps of a known law whose optimal-loss frontier is
not the fitted form E + k·C^-γ (small budgets pay an extra loss that fades with compute, as untuned
hyperparameters do): the truth at 4× the largest budget is the law's own minimum over N, found numerically."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize

from transformer.scaling import backtest, frontier, predict
from transformer.scaling import points as points_lib

E, A, B, ALPHA, BETA = 1.8, 400.0, 2000.0, 0.34, 0.37
EXTRA, C_REF, FADE = 0.06, 1e17, 0.35  # extra loss EXTRA·(C_REF/C)^FADE: large at small budgets, fading
BUDGETS = np.geomspace(1e17, 1e17 * 2**9, 10)
SIGMA = 0.004


def law(n, d):
    c = 6 * n * d
    return E + A / n**ALPHA + B / d**BETA + EXTRA * (C_REF / c) ** FADE


def true_optimal_loss(c: float) -> float:
    """min over N of the law at compute C (numerically, in ln N)."""
    res = optimize.minimize_scalar(lambda x: law(np.exp(x), c / (6 * np.exp(x))), bounds=(5, 35), method="bounded",
                                   options={"xatol": 1e-9})
    return float(res.fun)


def sweep(seed: int) -> points_lib.Points:
    """7 sizes per budget, ±0.5 decades around the law's optimum, loss noise SIGMA in ln L."""
    rng = np.random.default_rng(seed)
    n, c = [], []
    for flops in BUDGETS:
        x = optimize.minimize_scalar(lambda x: law(np.exp(x), flops / (6 * np.exp(x))), bounds=(5, 35),
                                     method="bounded").x
        n.extend(np.exp(x) * np.logspace(-0.5, 0.5, 7) * np.exp(rng.normal(0, 0.05)))
        c.extend([flops] * 7)
    n, c = np.array(n), np.array(c)
    d = c / (6 * n)
    return points_lib.from_arrays(n, d, law(n, d) * np.exp(rng.normal(0, SIGMA, len(n))), flops=c)


def coverage(sweeps: int, samples: int) -> dict[str, float]:
    """At 4× C_max over `sweeps` simulated sweeps: the share of calibrated intervals holding the truth (`covered`),
    of noise-only ones (`noise_covered`), the median |error|, and the median log half-width of the calibrated
    interval against the 95% quantile of |ln(L̂ / L)| (`half_over_q95`: 1 for an interval exactly as wide as the
    errors need at 95%)."""
    target = BUDGETS[-1] * 4
    truth = true_optimal_loss(target)
    hits, noise_hits, errors, log_errors, halves = 0, 0, [], [], []
    for seed in range(sweeps):
        pred = predict.frontier_predictions(sweep(seed), [target], samples=samples, seed=seed)["predictions"][0]
        lo, hi = pred["loss_ci95"]
        hits += lo <= truth <= hi
        nlo, nhi = pred["loss_noise_ci95"]
        noise_hits += nlo <= truth <= nhi
        errors.append(abs(pred["loss"] / truth - 1))
        log_errors.append(abs(np.log(pred["loss"] / truth)))
        halves.append(np.log(hi / lo) / 2)
    return {"covered": hits / sweeps, "noise_covered": noise_hits / sweeps, "median_error": float(np.median(errors)),
            "half_over_q95": float(np.median(halves) / np.quantile(log_errors, 0.95))}


def test_calibrated_interval_covers_the_truth_over_simulated_sweeps():
    got = coverage(sweeps=12, samples=12)
    assert got["covered"] >= 0.9, got
    assert got["noise_covered"] < got["covered"]  # the noise draws alone miss the frontier's misfit
    assert got["median_error"] < 0.015
    # Not wider than needed: 1.67× the 95% quantile of |e| over these 12 sweeps with the lever x·γ^0.5/span^0.625 (this
    # law's frontier γ is ~0.2; 2.11× with x/span^0.75, 1.69× with x/span, 1.72× with the terms in quadrature; 2.67× with
    # m = 1, the old interval). These 10 budgets over 512× are smoother than published sweeps, whose pairs set the width.
    assert got["half_over_q95"] < 2.0, got


@pytest.mark.slow
def test_calibrated_interval_coverage_many_sweeps():
    got = coverage(sweeps=100, samples=40)
    assert got["covered"] >= 0.9, got
    assert got["median_error"] < 0.015
    # With m = 1 (the old interval): 1.77 over 30 sweeps. 1.01 under the hard χ² test; 1.42 since the soft test
    # (2026-11-27), whose averaged forecasts shrink the tail of |e| (its 95% quantile by ~30%, median 0.34% → 0.37%)
    # while q stays calibrated on published pairs: covered 97% → 100%. 1.37 (covered 99%) since the interval is the
    # larger of its noise and extrapolation terms, not the two in quadrature (2026-11-27). 1.71 (covered 100%) with the
    # lever x/span^0.75 (2026-11-27); 1.35 (covered 96%) with the lever x·γ^0.5/span^0.625 (2026-11-27, late): see the
    # default test.
    assert got["half_over_q95"] < 1.6, got


def test_conformal_multiplier_and_leave_group_out():
    """The multiplier is the ⌈(n + 1)·0.95⌉-th smallest score: new scores from the same distribution fall below it
    ≥ 95% of the time (measured on 2,000 fresh draws per calibration); a group's own scores never set its multiplier."""
    rng = np.random.default_rng(0)
    hits = [np.mean(rng.exponential(size=2000) <= backtest.conformal_multiplier(rng.exponential(size=39)))
            for _ in range(300)]
    assert 0.94 <= np.mean(hits) <= 0.97
    assert backtest.conformal_multiplier(np.arange(1.0, 20.0)) == 19.0  # n = 19: the largest
    assert backtest.conformal_multiplier(np.arange(1.0, 18.0)) == float("inf")  # too few for 95%
    scores, groups = np.r_[np.linspace(0.1, 0.5, 40), 9.0, 9.5], ["a"] * 40 + ["b", "b"]
    out = backtest.leave_group_out(scores, groups)
    assert out[-1] == out[-2] == backtest.conformal_multiplier(scores[:40]) < 9.0  # b's outliers do not cover b
    assert out[0] == float("inf")  # without "a", two scores are too few to calibrate a 95% multiplier


def test_interval_widens_with_distance_in_units_of_the_fitted_span():
    near, _ = backtest.frontier_interval(2.0, np.log(2), np.log(16), 0.001, "seeds")
    far, terms = backtest.frontier_interval(2.0, np.log(8), np.log(16), 0.001, "seeds")
    assert far.hi - far.lo > 2.5 * (near.hi - near.lo) and far.source == "seeds"
    assert terms["lever"] == pytest.approx(np.log(8) / np.log(16) ** backtest.SPAN_POWER) and terms["spread_from"]
    narrow_data, _ = backtest.frontier_interval(2.0, np.log(8), np.log(4), 0.001, "seeds")
    assert narrow_data.hi - narrow_data.lo > 1.5 * (far.hi - far.lo)  # the same distance is further for a quarter of
    # the span (half the span in e-folds: a lever 2^0.625 = 1.54× as long)


def test_backtest_pairs_every_origin_with_three_budgets_and_exact_law_has_no_error():
    flops_B = np.geomspace(1e18, 1e18 * 2**6, 7)
    law_ = {"E": 1.7, "k": 300.0, "gamma": 0.15}
    loss_B = law_["E"] + law_["k"] * flops_B ** -law_["gamma"]
    pairs = backtest.pairs(flops_B, loss_B, frontier.fit_largest, frontier.loss_at)
    assert sorted({p["k"] for p in pairs}) == [3, 4, 5, 6]
    assert len(pairs) == 4 + 3 + 2 + 1  # each refit predicts every later budget
    assert max(abs(p["log_error"]) for p in pairs) < 1e-5
    assert {round(p["distance"] / np.log(2)) for p in pairs} == {1, 2, 3, 4}


def test_frontier_is_set_by_the_largest_budgets():
    """Minima that follow E + k·C^-γ at the six largest budgets but sit far above it at the small ones (an
    untuned start): the frontier follows the large budgets, so the prediction beyond them holds."""
    flops_B = np.geomspace(1e18, 1e18 * 2**9, 10)
    loss_B = 1.7 + 300.0 * flops_B ** -0.15
    loss_B[:4] *= 1.0 + np.array([0.08, 0.05, 0.03, 0.015])
    target = flops_B[-1] * 4
    predicted = frontier.loss_at(frontier.fit_largest(flops_B, loss_B), target)
    assert predicted == pytest.approx(1.7 + 300.0 * target ** -0.15, rel=1e-4)


def test_frontier_warns_when_its_form_misfits_the_minima_beyond_their_noise():
    """Minima zig-zagging ±1% about E + k·C^-γ while their noise draws scatter 0.1%: the frontier warns; the same
    minima without the zig-zag do not."""
    from transformer.scaling import fits

    flops_B = np.geomspace(1e18, 1e18 * 2**7, 8)
    rng = np.random.default_rng(0)

    def frontier_of(loss_B):
        a2 = {"a": 0.5, "budgets": [{"C_opt": c, "loss_opt": l} for c, l in zip(flops_B, loss_B)]}
        draws2 = {"C_opt": np.repeat(flops_B[:, None], 30, 1),
                  "loss_opt": loss_B[:, None] * np.exp(rng.normal(0, 0.001, (8, 30))),
                  **{k: np.full(30, 0.5) for k in ("a", "b", "N_coef", "D_coef")}}
        return frontier.fit_frontier(a2, draws2, {}, "seeds")

    smooth_B = 1.7 + 300.0 * flops_B ** -0.15
    assert "warning" not in frontier_of(smooth_B)
    assert "does not describe these minima" in frontier_of(smooth_B * (1 + 0.01 * (-1) ** np.arange(8)))["warning"]


def test_a_runaway_extrapolation_gives_no_interval_instead_of_inf():
    ci, terms = backtest.frontier_interval(2.0, 2.0, 1e-300, 0.01, "residuals")
    assert ci.to_json() is None and "runs away" in ci.note and not terms["calibrated"]


def test_each_noise_draw_of_the_frontier_repeats_the_choice_of_e():
    """Draw k of the frontier is `frontier.choose` on draw k of the minima with approach 3's draw k of E: where
    that E is one the drawn minima reject, the draw frees E as the point estimate would have (before, every draw
    held approach 3's draw because the point estimate did, and the draws left out the choice's own uncertainty:
    the compute multiplier's intervals covered 85–89% at three of four budgets, docs/limitations.md)."""
    flops_B, k_draws = np.geomspace(1e18, 1e18 * 2**10, 6), 12
    loss_B = 1.7 + 300.0 * flops_B ** -0.15
    rng = np.random.default_rng(0)
    a2 = {"a": 0.5, "budgets": [{"C_opt": c, "loss_opt": l} for c, l in zip(flops_B, loss_B)]}
    draws2 = {"C_opt": np.repeat(flops_B[:, None], k_draws, 1),
              "loss_opt": loss_B[:, None] * np.exp(rng.normal(0, 0.002, (6, k_draws))),
              **{k: np.full(k_draws, 0.5) for k in ("a", "b", "N_coef", "D_coef")}}
    e_K = np.where(np.arange(k_draws) % 2 == 0, 1.7 + rng.normal(0, 0.01, k_draws), 0.8)  # odd draws: far off
    out = frontier.fit_frontier(a2, draws2, {"E": 1.7, "bootstrap": {"draws": {"E": list(e_K)}}}, "seeds")
    assert out["E_from"] == "approach 3"
    noise_sd = frontier.minima_noise(flops_B, draws2)
    drawn_E = out["bootstrap"]["draws"]["E"]
    for k in range(k_draws):
        law, choice = frontier.choose(flops_B, draws2["loss_opt"][:, k], e_K[k], noise_sd)
        assert drawn_E[k] == pytest.approx(law["E"], rel=1e-9)
        assert choice["E_from"] == ("approach 3" if k % 2 == 0 else "the minima (they reject approach 3's E)")
    assert out["bootstrap"]["E_held"] == k_draws // 2
    assert all(abs(drawn_E[k] - 1.7) < 0.3 for k in range(1, k_draws, 2))  # freed: near the minima's own E
