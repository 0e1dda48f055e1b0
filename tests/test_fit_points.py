"""Loss at any (N, D) (approach 3 or the over-training form, chosen by backtests by model size and by tokens per
parameter; intervals that grow with the distance beyond the data in both) on an over-training grid: a model family
trained at several token counts each, predicted at a larger model and more tokens."""
from __future__ import annotations

import numpy as np
import pytest

from transformer.spec import ConfigError
from transformer.scaling import at_points, fits, overtrain, point_interval, report
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
    assert out["backtest"]["size"]["pairs"] and out["backtest"]["tokens_per_param"]["pairs"]
    for p, (n, d) in zip(out["predictions"], asked):
        truth = law(n, d)
        assert p["loss"] == pytest.approx(truth, rel=0.01)
        assert p["loss_ci95"][0] <= truth <= p["loss_ci95"][1]
        assert p["loss_interval"]["calibrated"]
    text = report.summary(fit)
    assert "loss at N = 1e+09, D = 2e+11" in text and "by model size / by tokens per parameter" in text


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
            assert "loss at (N, D) from overtrain" in text and "chosen by the backtests" in text
    assert chosen.count("overtrain") >= 4, chosen
    # The over-training form misses approach 3's law (α ≠ β) by ~0.4% in backtest; at 0.3% noise the two forms'
    # backtest errors are both near the noise (0.0034 vs 0.0047 on one Xeon, another order elsewhere), so the loser is
    # shown where the noise (0.05%) is well below that misfit: there the margin is 3.8x, not a floating-point accident.
    other = fits.fit_all(overtraining_grid(noise=0.0005), bootstrap=8, approach3_near=0,
                         predict_points=asked)["point_predictions"]
    assert other["chosen"] == "approach3", other["candidates"]
    assert other["candidates"]["overtrain"]["backtest_median_abs_error"] > 2 * other["candidates"]["approach3"][
        "backtest_median_abs_error"]


@pytest.mark.slow
def test_interval_is_calibrated_on_published_holdouts():
    """Porian et al.'s five OpenWebText2 settings (shipped), refitted on the sizes ≤ N_max/2 and ≤ N_max/4 and on the
    points at ≤ 10 and ≤ 40 tokens per parameter, predict every other point (`experiments.reproduce_points`): the
    interval with the shipped multipliers covers ≥ 90% of the held-out points in each regime (each setting and
    hold-out weighted equally), and is not wider than needed: its median log half-width is below the 95% quantile
    of |ln(L̂/L)| (the shipped multipliers were calibrated on these settings among 21 other sets and the ladder);
    beyond the fitted tokens per parameter it covers ≥ 90% near the data and far from it."""
    reproduce, reproduce_points = cli_module("reproduce"), cli_module("reproduce_points")
    cases = [c for row, pts in reproduce.porian_settings() if row["dataset"] == "OpenWebText2"
             for c in reproduce_points.holdout(row["experiment"], pts)]
    assert len(cases) == 20 and all("points" in c for c in cases), [c.get("note") for c in cases]
    m = {"size": point_interval.SIZE_MULTIPLIER, "tokens_per_param": point_interval.TPP_MULTIPLIER}
    for regime in m:
        covered, halves, log_errors = [], [], []
        for c in (c for c in cases if c["regime"] == regime):
            hits = [abs(p["log_error"]) <= reproduce_points.half_width(p, m) for p in c["points"]]
            covered.append(np.mean(hits))
            halves += [reproduce_points.half_width(p, m) for p in c["points"]]
            log_errors += [abs(p["log_error"]) for p in c["points"]]
        assert np.mean(covered) >= 0.9, (regime, covered)
        assert np.median(halves) < np.quantile(log_errors, 0.95), (regime, np.median(halves))
    # Just beyond the fitted tokens per parameter (≤ 2×) and far beyond it (> 4×) alike: the term's growth per e-fold
    # (8) is what keeps the far points covered at a multiplier the near ones need (with the growth of size, 1, and
    # the same multiplier, these settings' points > 4× beyond were covered 64%).
    tpp = [c for c in cases if c["regime"] == "tokens_per_param"]
    for lo, hi in ((0.0, np.log(2)), (np.log(4), np.inf)):
        covered = [np.mean(hits) for c in tpp if (hits := [abs(p["log_error"]) <= reproduce_points.half_width(p, m)
                                                           for p in c["points"]
                                                           if lo < p["distances"]["tokens_per_param"] <= hi])]
        assert len(covered) >= 8 and np.mean(covered) >= 0.9, (lo, hi, covered)


def test_interval_grows_beyond_the_data_in_tokens_per_parameter():
    """A model inside the fitted sizes and tokens but trained at 4× the most tokens per parameter fitted (the
    smallest size at 1,280 tokens per parameter: D = 1.3e10 < D_max 1e11) is an extrapolation: its interval has
    a tokens-per-parameter term, m_M·b_M·(1 + G_M·x), is wider than inside the data (here, on the law's own form and
    0.3% noise, 1.3× or more), and covers the truth.
    Before, the distance counted model size and tokens only (0 here): it got the noise-only interval of a point
    inside the data."""
    pts = gadre_grid(1)
    beyond, inside = (1e7, 1e7 * 1280), (1e8, 1e8 * 40)
    out = fits.fit_all(pts, approach3_near=0, predict_points=[beyond, inside])["point_predictions"]
    far, near = out["predictions"]
    widths = [np.log(p["loss_ci95"][1] / p["loss_ci95"][0]) for p in (far, near)]
    assert widths[0] > 1.3 * widths[1], widths
    assert far["loss_interval"]["distances"]["tokens_per_param"] == pytest.approx(np.log(4), rel=1e-6)
    assert far["loss_interval"]["distances"]["params"] == 0 and far["loss_interval"]["distances"]["tokens"] == 0
    terms, iv = far["loss_interval"]["terms_log"], out["interval"]
    assert terms["size"] == 0 and terms["tokens_per_param"] == pytest.approx(
        iv["multipliers"]["tokens_per_param"] * iv["scales_log"]["tokens_per_param"]
        * (1 + iv["growth_per_efold"]["tokens_per_param"] * np.log(4)))
    assert near["loss_interval"]["driven_by"] == "noise" and near["loss_interval"]["terms_log"]["tokens_per_param"] == 0
    truth = overtrain.loss_at(GADRE, *beyond)
    assert far["loss_ci95"][0] <= truth <= far["loss_ci95"][1]


def isoflop_grid(seed: int = 0) -> points_lib.Points:
    """5 IsoFLOP budgets × 7 sizes spanning 25× around each optimum of approach 3's law above, 0.3% noise."""
    rng = np.random.default_rng(seed)
    g = (ALPHA * A / (BETA * B)) ** (1 / (ALPHA + BETA))
    rows = []
    for c in np.geomspace(1e18, 1.6e19, 5):
        for n in g * (c / 6) ** (BETA / (ALPHA + BETA)) * np.geomspace(1 / 5, 5, 7):
            d = c / (6 * n)
            rows.append((n, d, float(law(n, d) * np.exp(rng.normal(0, 0.003))), c))
    n, d, loss, c = zip(*rows)
    return points_lib.from_arrays(n, d, loss, flops=c)


def test_intervals_are_calibrated_with_the_default_approach3_near(monkeypatch):
    """The loss at (N, D) is fitted to the points approach 3 keeps (`--approach3_near`, 3 by default: the points
    within 3× of each budget's optimum); its multipliers are calibrated on hold-outs fitted the same way, with the
    CLI's default, and a fit with another setting says so. Before, the multiplier was calibrated with
    `--approach3_near=0` (every point) while the CLI's default was 3: the two disagreed."""
    reproduce_points, fit_cli = cli_module("reproduce_points"), cli_module("fit")
    assert fit_cli._NEAR.default == fits.APPROACH3_NEAR
    seen = []
    real = fits.fit_all
    monkeypatch.setattr(fits, "fit_all", lambda *a, **kw: seen.append(kw["approach3_near"]) or real(*a, **kw))
    cases = reproduce_points.holdout("iso", isoflop_grid())
    assert seen and set(seen) == {fits.APPROACH3_NEAR}, seen
    assert any("points" in c for c in cases)
    pts, asked = isoflop_grid(), [(3e9, 6e10)]
    default, every = (real(pts, approach3_near=near, predict_points=asked) for near in (fits.APPROACH3_NEAR, 0.0))
    assert "note" not in default["point_predictions"]
    assert "calibrated with the default approach3_near=3" in every["point_predictions"]["note"]
    assert "note: fitted to all points" in report.summary(every)


def test_form_is_chosen_by_both_backtests_and_reported():
    """Each form's median |error| in both backtests (by model size, by tokens per parameter) is in fit.json and on
    the console, and the form with the smaller mean of the two predicts."""
    fit = fits.fit_all(gadre_grid(2), approach3_near=0, predict_points=[(1e9, 5e11)])
    out = fit["point_predictions"]
    score = {}
    for name, c in out["candidates"].items():
        size, tpp = c["backtest_size"], c["backtest_tokens_per_param"]
        assert size["pairs"] > 0 and tpp["pairs"] > 0, c
        score[name] = (size["median_abs_error"] + tpp["median_abs_error"]) / 2
        assert c["backtest_median_abs_error"] == pytest.approx(score[name])
    assert out["chosen"] == min(score, key=score.get)
    line = report.summary(fit).splitlines()
    assert any("by model size / by tokens per parameter: approach3" in x and "overtrain" in x for x in line)


def test_size_backtest_refits_do_not_see_the_held_out_points():
    """Each refit of the size backtest knows only its own points: changing the losses of the largest size (which no
    refit uses, by 0.2%) leaves every backtest prediction as it was. Before, approach 3's refits started from the fit to all
    the points and L-BFGS-B stopped short of their own optimum, so the held-out points moved the predictions."""
    pts = overtraining_grid(noise=0.0005).canonical()
    largest = pts.params_P == pts.params_P.max()
    moved = points_lib.from_arrays(pts.params_P, pts.tokens_P, pts.loss_P * np.where(largest, 1.002, 1.0))
    runs = [at_points.predict(p, [(1e9, 1e11)]) for p in (pts, moved)]
    assert [r["chosen"] for r in runs] == ["approach3", "approach3"]
    pairs = [[(q["params"], q["tokens"], q["predicted"]) for q in r["backtest"]["size"]["pairs"]] for r in runs]
    assert len(pairs[0]) > 0
    assert pairs[0] == pairs[1]
    # Likewise the backtest by tokens per parameter: the most over-trained points are in no refit.
    most = pts.tokens_P / pts.params_P == (pts.tokens_P / pts.params_P).max()
    moved = points_lib.from_arrays(pts.params_P, pts.tokens_P, pts.loss_P * np.where(most, 1.002, 1.0))
    runs = [at_points.predict(p, [(1e9, 1e11)]) for p in (pts, moved)]
    pairs = [[(q["params"], q["tokens"], q["predicted"]) for q in r["backtest"]["tokens_per_param"]["pairs"]]
             for r in runs]
    assert len(pairs[0]) > 0 and pairs[0] == pairs[1]


def _case(source: str, regime: str, errors: list[float], unit: float = 0.01) -> dict:
    other = "tokens_per_param" if regime == "size" else "size"
    return {"source": source, "family": source, "regime": regime, "data": source, "case": regime,
            "points": [{"log_error": e, "noise": 0.0, "unit": {regime: unit, other: 0.0}} for e in errors]}


def test_multipliers_weigh_each_holdout_equally_and_leave_a_source_out():
    """A multiplier is the split-conformal 95% quantile of its regime's scores (|e| / unit beside the other terms,
    `backtest.conformal_multiplier`) with every hold-out weighted equally however many points it has, and out of
    sample each source gets the other sources'."""
    reproduce_points = cli_module("reproduce_points")
    many_small = _case("A", "size", [0.01] * 100)  # one hold-out of 100 points at score 1
    few_large = [_case(f"B{i}", "size", [0.05]) for i in range(3)]  # 3 hold-outs of one point at score 5
    low = [_case(f"L{i}", "size", [0.005]) for i in range(17)]  # 17 of one point at score 0.5
    tpp = [_case("C", "tokens_per_param", [0.02, 0.02]) for _ in range(20)]
    cases = [many_small, *few_large, *low, *tpp]
    m = reproduce_points.multipliers(cases)
    # 21 hold-outs: the conformal rank ceil(0.95 * 22) = 21 is a 5 (pooled by point, 117 of 120 are <= 1: it would be 1)
    assert m["size"] == pytest.approx(5.0)
    assert m["tokens_per_param"] == pytest.approx(2.0)
    # 18 hold-outs are too few for a 95% conformal quantile (n + 1 < 20): no multiplier, not the largest score
    assert reproduce_points.multipliers([many_small, *low])["size"] == 0.0
    reproduce_points.calibrate(cases)
    assert many_small["m_out"]["size"] == pytest.approx(5.0) and few_large[0]["m_out"]["size"] == pytest.approx(5.0)
    assert tpp[0]["m_out"]["tokens_per_param"] == 0.0  # no other source has a hold-out by tokens per parameter
    assert all(p["covered_out"] for p in many_small["points"]) and not tpp[0]["points"][0]["covered_out"]
    # the other direction's term counts before this one's: a point it already covers needs no multiplier
    both = {"log_error": 0.05, "noise": 0.03, "unit": {"size": 0.01, "tokens_per_param": 0.045}}
    assert reproduce_points.score(both, "size", {"size": 0.0, "tokens_per_param": 1.0}) == 0.0
    assert reproduce_points.score(both, "size", {"size": 0.0, "tokens_per_param": 0.0}) == pytest.approx(4.0)  # √(5² − 3²)/1


def test_the_size_term_grows_less_than_in_proportion_to_the_backtest_error():
    """s = 1%·(b / 1%)^0.7 in model size (a fit whose backtest misses 4× more gets a term 4^0.7 = 2.6× wider: with
    s = b, published hold-outs with the smallest third of b were covered 87% and the largest 99%), b itself in tokens
    per parameter; the console names both s and the backtest's b it came from."""
    s = lambda b, d: point_interval.effective_scale(b, d)
    assert s(0.01, "size") == pytest.approx(0.01) and s(0.0, "size") == 0.0
    assert s(0.04, "size") / s(0.01, "size") == pytest.approx(4 ** point_interval.SCALE_POWER["size"])
    assert 1.5 < s(0.04, "size") / s(0.01, "size") < 4
    assert s(0.04, "tokens_per_param") / s(0.01, "tokens_per_param") == pytest.approx(4)
    out = fits.fit_all(gadre_grid(1), approach3_near=0, predict_points=[(1e9, 5e11)])["point_predictions"]
    far, iv = out["predictions"][0], out["interval"]
    b = iv["scales_log"]["size"]
    assert far["loss_interval"]["terms_log"]["size"] == pytest.approx(
        point_interval.SIZE_MULTIPLIER * s(b, "size") * (1 + far["loss_interval"]["distances"]["params"]))
    line = next(ln for ln in report.points_lines(out) if ln.startswith("interval:"))
    assert f"(from the backtest's {100 * b:.2f}%)" in line and "in tokens per parameter" in line
