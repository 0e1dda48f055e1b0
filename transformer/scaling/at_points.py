"""The loss at any (N, D), for grids that are not IsoFLOP (over-training sweeps, a family at several token counts)
and for IsoFLOP grids asked about other (N, D): from approach 3's L(N, D) = E + A/N^α + B/D^β or from Gadre et al.
2024's over-training form (`overtrain`), whichever predicts better in its backtests, with an interval that grows
with the distance of extrapolation in model size and in tokens per parameter (`point_interval`).

Legend: P = points, Q = (N, D) pairs asked for, K = refits.

Both forms are fitted to the points approach 3 fits (by default those within 3× in N of their budget's optimum,
all of an over-training grid; on the published IsoFLOP sets this predicts the points at 1 or more tokens per
parameter better than a fit to every point, whose advantage is at models trained on far fewer tokens than
parameters: docs/fitting.md) and backtested inside the data in both directions (`point_backtests`): refitted on the smaller model sizes, and on the points at fewer tokens per
parameter, each predicts the points beyond. The form with the smaller mean of its two backtests' median |log error|
predicts (approach 3 on a tie, or where neither backtest has a pair); fit.json and the console give both forms'
errors in both directions. The interval's noise term is the chosen form's log residual RMS, its extrapolation terms
the chosen form's backtest errors per direction, scaled by multipliers calibrated on published hold-outs
(`point_interval`).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from transformer.spec import ConfigError
from transformer.scaling import csv_checks, interval, overtrain, parametric, point_backtests, point_interval
from transformer.scaling.point_backtests import MIN_SIZES  # noqa: F401 (re-exported: the refits' minimum)
from transformer.scaling.points import Points

APPROACH3_PARAMS, OVERTRAIN_PARAMS = 5, 4  # parameters of each form (its residual degrees of freedom)
MISFIT_FLAG = 2.0  # the chosen form misfits when its log residual RMS exceeds this many times the loss noise σ
FORMS = {"approach3": "L(N, D) = E + A/N^alpha + B/D^beta (approach 3)", "overtrain": overtrain.FORM}
BACKTESTS = {"size": "refit on the smallest k model sizes, predict every point of the larger ones; distance = "
                     "ln(N / N_k)",
             "tokens_per_param": "refit on the points at ≤ M_t tokens per parameter, predict every point beyond; "
                                 "distance = ln(M / M_t)"}
CHOSEN_BY = ("the smaller mean of the two backtests' median |log error| (by model size and by tokens per parameter; "
             "approach 3 on a tie)")


def parse(texts: Sequence[str], source: str = "--predict_points") -> list[tuple[float, float]]:
    """["N:D", ...] as [(N, D), ...]; ConfigError naming the bad entry and `source`, also for N or D off the plausible
    scale of a count (`csv_checks`: e.g. tokens as log10)."""
    out = []
    for text in texts:
        n_text, sep, d_text = text.partition(":")
        try:
            n, d = float(n_text), float(d_text)
        except ValueError:
            n = d = float("nan")
        if not sep or not (np.isfinite(n) and np.isfinite(d) and n > 0 and d > 0):
            raise ConfigError(f"{source}: {text!r} is not N:D with positive numbers, e.g. 1e9:2e10")
        if not (csv_checks.MIN_COUNT <= n <= csv_checks.MAX_PARAMS and csv_checks.MIN_COUNT <= d <= csv_checks.MAX_TOKENS):
            raise ConfigError(f"{source}: {text!r} is off the plausible scale (N in [{csv_checks.MIN_COUNT:g}, "
                              f"{csv_checks.MAX_PARAMS:g}], D in [{csv_checks.MIN_COUNT:g}, {csv_checks.MAX_TOKENS:g}]): "
                              "give parameter and token counts, not millions, billions or log10")
        out.append((n, d))
    return out


def _loss(fit: dict[str, float] | parametric.LossFit, n: np.ndarray, d: np.ndarray) -> np.ndarray:
    get = fit.__getitem__ if isinstance(fit, dict) else lambda k: getattr(fit, k)
    return parametric.law_loss(get("E"), get("A"), get("B"), get("alpha"), get("beta"), n, d)


def _forms(points: Points, a3: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Both forms fitted to the points and backtested in both directions: per form {"law", "loss_fn", "rms" (log
    residual RMS), "params" (its parameter count), "backtests": {"size": pairs, "tokens_per_param": pairs}}. The refits start from their own profile
    grid, not from the fit to all the points: a start that knows the held-out points leaks them into the refit
    wherever the optimizer stops short of the refit's own optimum. `a3`: approach 3 already fitted to these points
    (its E, A, B, alpha, beta), else fitted here."""
    n_P, d_P, l_P = points.params_P, points.tokens_P, points.loss_P
    keys = ("E", "A", "B", "alpha", "beta")
    if a3 is None or any(a3.get(k) is None for k in keys):
        fit = parametric.fit_loss(n_P, d_P, l_P)
        a3 = {k: getattr(fit, k) for k in keys}
    law3 = {k: float(a3[k]) for k in keys}
    law_ot = overtrain.fit(n_P, d_P, l_P)
    fit_many = {"approach3": lambda train_KP: parametric.fit_batch(n_P, d_P, np.broadcast_to(l_P, train_KP.shape),
                                                                     train_KP),
                "overtrain": lambda train_KP: overtrain.fit_many(n_P, d_P, l_P, train_KP)}
    loss_fn = {"approach3": _loss, "overtrain": overtrain.loss_at}
    out = {}
    for name, law, k in (("approach3", law3, APPROACH3_PARAMS), ("overtrain", law_ot, OVERTRAIN_PARAMS)):
        with np.errstate(over="ignore", invalid="ignore"):
            r_P = np.log(l_P / loss_fn[name](law, n_P, d_P))
        out[name] = {"law": law, "loss_fn": loss_fn[name], "params": k,
                     "rms": float(np.sqrt(np.mean(r_P**2))) if np.all(np.isfinite(r_P)) else float("inf"),
                     "backtests": {"size": point_backtests.size_backtest(points, fit_many[name], loss_fn[name]),
                                   "tokens_per_param": point_backtests.tpp_backtest(points, fit_many[name],
                                                                                    loss_fn[name])}}
    return out


def _score(form: dict[str, Any]) -> float:
    """The mean of the form's backtests' median |log error| over the directions that have pairs (inf: none)."""
    medians = [m for m in (point_backtests.median_abs(bt) for bt in form["backtests"].values()) if m is not None]
    return float(np.mean(medians)) if medians else float("inf")


def predict(points: Points, asked_Q: Sequence[tuple[float, float]], sigma: float | None = None,
            a3: dict[str, Any] | None = None) -> dict[str, Any]:
    """fit.json's "point_predictions": {"form", "chosen", "chosen_by", "candidates" (each form's law, residual RMS
    and backtest errors in both directions), "backtest" (the chosen form's, per direction), "fitted_range",
    "interval" (what sets every interval), "predictions": [{"params", "tokens", "loss", "loss_ci95",
    "loss_ci95_source", "loss_interval"}], "warning"?} for the (N, D) pairs `asked_Q`, from both forms fitted to
    `points` (the points approach 3 fits; module docstring). `sigma`: the loss noise σ in ln L, for the misfit warning; `a3`: approach
    3 fitted to `points` (fit.json's "approach3"), else fitted here."""
    if len(points) < 5 or len(np.unique(points.params_P)) < 2:
        return {"note": f"{len(points)} points of {len(np.unique(points.params_P))} model sizes: the loss at (N, D) "
                        "needs at least 5 points and 2 sizes"}
    forms = _forms(points, a3)
    chosen = "overtrain" if _score(forms["overtrain"]) < _score(forms["approach3"]) else "approach3"
    form = forms[chosen]
    candidates = {name: {"form": FORMS[name], "law": f["law"], "rms_log_residual": f["rms"],
                         "backtest_median_abs_error": _score(f) if np.isfinite(_score(f)) else None,
                         **{f"backtest_{d}": {"pairs": len(bt), "median_abs_error": point_backtests.median_abs(bt)}
                            for d, bt in f["backtests"].items()}}
                  for name, f in forms.items()}
    noise_sd = interval.residual_sd(form["rms"], len(points) - form["params"])
    b = {d: point_backtests.median_abs(bt) for d, bt in form["backtests"].items()}
    scale = point_interval.scales(b["size"], b["tokens_per_param"], noise_sd)
    fitted = point_interval.fitted_range(points.params_P, points.tokens_P)
    preds = []
    for n, d in asked_Q:
        loss = float(form["loss_fn"](form["law"], n, d))
        x = point_interval.distances(n, d, fitted)
        ci, terms = point_interval.interval(loss, x, noise_sd, len(points) - form["params"], scale, "fit_residuals")
        preds.append({"params": n, "tokens": d, "loss": loss, **ci.fields("loss"), "loss_interval": terms})
    out: dict[str, Any] = {
        "form": FORMS[chosen], "chosen": chosen, "candidates": candidates, "chosen_by": CHOSEN_BY,
        "backtest": {d: point_backtests.summary(bt, BACKTESTS[d]) for d, bt in form["backtests"].items()},
        "fitted_range": fitted,
        "interval": {"noise_sd_log": noise_sd, "noise_source": "fit_residuals", "scales_log": scale,
                     "multipliers": {"size": point_interval.SIZE_MULTIPLIER,
                                     "tokens_per_param": point_interval.TPP_MULTIPLIER},
                     "growth_per_efold": dict(point_interval.GROWTH),
                     "effective_scales_log": {d: point_interval.effective_scale(scale[d], d)
                                              for d in point_interval.DIRECTIONS},
                     "scale_power": dict(point_interval.SCALE_POWER), "calibrated_on": point_interval.CALIBRATION},
        "predictions": preds}
    if sigma and form["rms"] > MISFIT_FLAG * sigma:
        out["warning"] = (f"residual RMS {form['rms']:.4f} is {form['rms'] / sigma:.1f}x the loss noise σ {sigma:.4f}: "
                          f"{FORMS[chosen]} does not describe these points to their noise")
    return out
