"""The loss at any (N, D), with intervals calibrated on a backtest by model size, for grids that are not IsoFLOP
(over-training sweeps, a family at several token counts): from approach 3's L(N, D) = E + A/N^α + B/D^β or from
Gadre et al. 2024's over-training form (`overtrain`), whichever predicts better on the backtest.

Legend: P = points, Q = (N, D) pairs asked for, K = noise draws, J = backtest pairs.

Backtest: the distinct model sizes, increasing; for each k from max(MIN_SIZES, half of them) to all but the
largest, approach 3 is refitted on the points of the k smallest sizes and predicts every point of the larger
ones: e = ln(L̂ / L) at the distance x = ln(N / N_k) + max(0, ln(D / D_max)) beyond the refit's largest model
(and tokens), for points at least 1.5× beyond it (MIN_DISTANCE; nearer ones measure noise and would blow e/x
up on a near-continuous ladder of sizes, as Chinchilla's). Both forms are backtested on the same pairs; the one
with the smaller median |e| predicts (approach 3 on a tie or where neither has a pair). The misfit scale and the
interval are `backtest.misfit_scale` / `backtest.interval`'s, with the noise term the sd of ln L̂ over approach 3's
loss-noise draws, or where there are none (the over-training form; no loss-noise estimate) the chosen form's log
residual RMS ("fit_residuals"): the scatter of one point about it, an upper bound on the noise of the fitted
curve; and the multiplier m = INTERVAL_SCALE, the conformal quantile
of |e| / (t·σ) over size hold-outs of published grids (`experiments.reproduce`, docs/fitting.md).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from transformer.spec import ConfigError
from transformer.scaling import backtest, csv_checks, interval, overtrain, parametric
from transformer.scaling.points import Points

MIN_SIZES = 3  # a refit sees at least this many model sizes (and 5 points)
APPROACH3_PARAMS, OVERTRAIN_PARAMS = 5, 4  # parameters of each form (its residual degrees of freedom)
MIN_DISTANCE = float(np.log(1.5))  # pairs nearer the refit's largest model than 1.5× are noise, not misfit: e/x explodes
MISFIT_FLAG = 2.0  # the chosen form misfits when its log residual RMS exceeds this many times the loss noise σ
# The conformal multiplier of t·σ (`backtest.conformal_multiplier`) from size hold-outs of the 21 published IsoFLOP
# sets (`experiments.reproduce`, 40 draws: refit on the sizes ≤ N_max/2 and ≤ N_max/4, predict every point of the
# larger ones; 42 cases, 1,092 points), one score per case, the 90% quantile of its points' |e| / (t·σ)
# (`experiments.reproduce_points.SUMMARY`): 2.553, rounded up. m = 1 covered 76.0% (2x) and 81.0% (4x) of the
# held-out points (sets weighted equally); each source's m calibrated on the others (2.52–2.93) covers 96.1% and
# 97.1%, and 40 of 42 cases' summary scores: the size backtest inside the data understates the error beyond it.
# docs/fitting.md "Loss at any (N, D)".
INTERVAL_SCALE = 2.6
FORMS = {"approach3": "L(N, D) = E + A/N^alpha + B/D^beta (approach 3)", "overtrain": overtrain.FORM}


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


def size_backtest(points: Points, fit_many: Callable[[np.ndarray], Sequence[Any]],
                  loss_fn: Callable[[Any, np.ndarray, np.ndarray], np.ndarray]) -> list[dict[str, float]]:
    """The backtest pairs by model size (module docstring) of the form `fit_many(train_KP)` fits (one fit per row of
    the (K, P) mask of each refit's points) and `loss_fn(fit, N, D)` evaluates."""
    sizes_S = np.unique(points.params_P)
    ks = [k for k in range(max(MIN_SIZES, len(sizes_S) // 2), len(sizes_S))
          if (points.params_P <= sizes_S[k - 1]).sum() >= 5]
    train_KP = np.array([points.params_P <= sizes_S[k - 1] for k in ks]).reshape(len(ks), len(points))
    out: list[dict[str, float]] = []
    for k, train_P, fit in zip(ks, train_KP, fit_many(train_KP) if ks else []):
        d_max = points.tokens_P[train_P].max()
        for i in np.flatnonzero(~train_P):
            n, d = points.params_P[i], points.tokens_P[i]
            predicted = float(loss_fn(fit, n, d))
            distance = float(np.log(n / sizes_S[k - 1]) + max(0.0, np.log(d / d_max)))
            if not (np.isfinite(predicted) and predicted > 0) or distance < MIN_DISTANCE:
                continue
            out.append({"k": k, "fit_params": float(sizes_S[k - 1]), "params": float(n), "tokens": float(d),
                        "distance": distance,
                        "predicted": predicted, "measured": float(points.loss_P[i]),
                        "log_error": float(np.log(predicted / points.loss_P[i]))})
    return out


def _median_abs(bt_J: list[dict[str, float]]) -> float:
    return float(np.median(np.abs([p["log_error"] for p in bt_J]))) if bt_J else float("inf")


def predict(points: Points, a3: dict[str, Any], asked_Q: Sequence[tuple[float, float]],
            sigma: float | None = None, source: str = "none") -> dict[str, Any]:
    """fit.json's "point_predictions": {"form", "chosen", "candidates", "backtest", "predictions": [{"params",
    "tokens", "loss", "loss_ci95", "loss_ci95_source", "loss_noise_ci95"?, "loss_interval"}], "warning"?} from
    approach 3 `a3` (fitted to `points`, with its bootstrap draws where there are any) or the over-training form,
    whichever has the smaller median |error| on the backtest by model size. `sigma`: the loss noise σ in ln L
    (for the misfit warning), from `source` (`interval.SOURCES`: the draws' source). The interval's noise term is
    the sd of ln L̂ over approach 3's draws, else the chosen form's log residual RMS ("fit_residuals"), else none
    (then an interval inside the data is null: never a zero-width one)."""
    if a3.get("E") is None:
        return {"note": f"approach 3 is not fitted ({a3.get('note', 'no result')}): no loss at (N, D)"}
    # The refits start from the profile grid alone, not from the fit to all the points: a start that knows the
    # held-out points leaks them into the refit wherever the optimizer stops short of the refit's own optimum.
    n_P, d_P, l_P = points.params_P, points.tokens_P, points.loss_P
    bt = {"approach3": size_backtest(points, lambda train_KP: parametric.fit_batch(
              n_P, d_P, np.broadcast_to(l_P, train_KP.shape), train_KP), _loss),
          "overtrain": size_backtest(points, lambda train_KP: overtrain.fit_many(n_P, d_P, l_P, train_KP),
                                     overtrain.loss_at)}
    law = overtrain.fit(points.params_P, points.tokens_P, points.loss_P)
    chosen = "overtrain" if _median_abs(bt["overtrain"]) < _median_abs(bt["approach3"]) else "approach3"
    candidates = {name: {"form": FORMS[name], "backtest_pairs": len(bt[name]),
                         "backtest_median_abs_error": _median_abs(bt[name]) if bt[name] else None}
                  for name in FORMS}
    candidates["overtrain"]["law"] = law
    candidates["approach3"]["law"] = {k: a3[k] for k in ("E", "A", "B", "alpha", "beta")}
    scale = backtest.misfit_scale(bt[chosen], multiplier=INTERVAL_SCALE)
    draws = a3.get("bootstrap", {}).get("draws") if chosen == "approach3" else None
    draws_source = a3.get("bootstrap", {}).get("source", source)
    # Without draws, the chosen form's own log residual RMS stands in for the noise ("fit_residuals").
    residual_sd = interval.residual_sd(law["rms_log_residual"], len(points) - OVERTRAIN_PARAMS) if chosen == "overtrain" \
        else interval.residual_sd(a3.get("residual_rms"), len(points) - APPROACH3_PARAMS)
    n_max, d_max = float(points.params_P.max()), float(points.tokens_P.max())
    preds = []
    for n, d in asked_Q:
        loss = float(_loss(a3, n, d) if chosen == "approach3" else overtrain.loss_at(law, n, d))
        pred: dict[str, Any] = {"params": n, "tokens": d, "loss": loss}
        noise_sd, noise_source = residual_sd, "fit_residuals"
        if draws:
            keys = ("E", "A", "B", "alpha", "beta")
            ok = [all(draws[k][i] is not None for k in keys) for i in range(len(draws["E"]))]
            cols = {k: np.array([v for v, good in zip(draws[k], ok) if good], float) for k in keys}
            with np.errstate(over="ignore", invalid="ignore"):
                loss_K = _loss(cols, n, d)
            loss_K = loss_K[np.isfinite(loss_K) & (loss_K > 0)]
            noise_ci = interval.from_draws(loss_K, draws_source)
            if noise_ci is not None:
                pred.update(noise_ci.fields("loss_noise"))
                noise_sd, noise_source = backtest.log_sd(loss_K), draws_source
        distance = max(0.0, np.log(n / n_max)) + max(0.0, np.log(d / d_max))
        ci, pred["loss_interval"] = backtest.interval(loss, distance, noise_sd, scale, noise_source)
        pred.update(ci.fields("loss"))
        preds.append(pred)
    out: dict[str, Any] = {
        "form": FORMS[chosen], "chosen": chosen, "candidates": candidates,
        "chosen_by": "the smaller median |log error| on the backtest by model size (approach 3 on a tie)",
        "predictions": preds,
        "backtest": {**backtest.summary(bt[chosen]), "method": f"refit {chosen} on the smallest k model sizes, "
                                                               "predict every point of the larger ones"}}
    if chosen == "approach3" and a3.get("warning"):
        out["warning"] = a3["warning"]
    elif chosen == "overtrain" and sigma and law["rms_log_residual"] > MISFIT_FLAG * sigma:
        out["warning"] = (f"residual RMS {law['rms_log_residual']:.4f} is {law['rms_log_residual'] / sigma:.1f}x the "
                          f"loss noise σ {sigma:.4f}: {overtrain.FORM} does not describe these points to their noise")
    return out
