"""Compute-optimal scaling fits: Chinchilla Approaches 1, 2 and 3 (Hoffmann et al. 2022), their
intervals from loss noise, the conventions side by side, the loss frontier and predictions.

Legend: P = points, G = compute grid values, K = noise draws, B = budgets.

Intervals are a parametric bootstrap: the losses are redrawn with the noise σ of `noise.estimate`
(seed replicates, else residuals) and everything is refitted; the design points stay as they are
(resampling points would delete design points and mix budget subsets).

Each approach returns a JSON-ready dict with the exponents `a` (N_opt ∝ C^a) and `b` (D_opt ∝ C^b),
the prefactors `N_coef`, `D_coef` (N_opt = N_coef·C^a, D_opt = D_coef·C^b), the ids of the points
used and excluded (with reasons), and a `note` instead of numbers when it cannot be fitted.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from transformer.spec import ConfigError
from transformer.scaling import at_points, conventions, frontier, interval, isoflop, noise, parametric, refits
from transformer.scaling.interval import draw_lists  # noqa: F401 (re-exported)
from transformer.scaling.isoflop import BUDGET_RTOL, approach2, group_budgets  # noqa: F401 (re-exported)
from transformer.scaling.points import Points

APPROACH3_NEAR = 3.0  # approach 3 fits the points within this factor in N of their budget's optimum
RESIDUAL_FLAG = 3.0  # a point's residual beyond this many σ is flagged
ENVELOPE_GRID = 200  # compute values of Approach 1's envelope when loss curves are available


def power_law(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares fit of log y = k·log x + log c; returns (k, c) (c may be inf for wild slopes)."""
    slope, intercept = np.polyfit(np.log(x), np.log(y), 1)
    with np.errstate(over="ignore"):
        return float(slope), float(np.exp(intercept))


def _unfitted(note: str, points: Points) -> dict[str, Any]:
    return {"a": None, "b": None, "note": note, "points_used": list(points.ids),
            "points_excluded": list(points.excluded)}


# ---------------------------------------------------------------- Approach 1


def envelope(points: Points) -> dict[str, np.ndarray]:
    """The lowest loss reached at each compute value, with the N and D that reached it.

    With loss curves: on a log-spaced grid across the curves' compute range, each curve's loss is
    interpolated (linearly in log C) where the grid value lies inside that curve, and the lowest
    is kept. Without curves: the final points that lower the running minimum loss along C.
    """
    if points.curves:
        lo = min(c.flops_S[0] for c in points.curves)
        hi = max(c.flops_S[-1] for c in points.curves)
        flops_G = np.geomspace(lo, hi, ENVELOPE_GRID)
        best_G = np.full(len(flops_G), np.inf)
        params_G, tokens_G = np.zeros(len(flops_G)), np.zeros(len(flops_G))
        for curve in points.curves:
            inside_G = (flops_G >= curve.flops_S[0]) & (flops_G <= curve.flops_S[-1])
            log_c_G = np.log(flops_G)
            loss_G = np.interp(log_c_G, np.log(curve.flops_S), curve.loss_S)
            tok_G = np.exp(np.interp(log_c_G, np.log(curve.flops_S), np.log(curve.tokens_S)))
            better_G = inside_G & (loss_G < best_G)
            best_G = np.where(better_G, loss_G, best_G)
            params_G = np.where(better_G, curve.params, params_G)
            tokens_G = np.where(better_G, tok_G, tokens_G)
        covered_G = np.isfinite(best_G)  # grid values inside no curve (gaps between budgets) are left out
        return {"flops": flops_G[covered_G], "params": params_G[covered_G], "tokens": tokens_G[covered_G],
                "loss": best_G[covered_G]}
    order_P = np.lexsort((points.loss_P, points.flops_P))
    running = np.minimum.accumulate(points.loss_P[order_P])
    on_front = np.concatenate([[True], points.loss_P[order_P][1:] < running[:-1]])
    idx = order_P[on_front]
    return {"flops": points.flops_P[idx], "params": points.params_P[idx],
            "tokens": points.tokens_P[idx], "loss": points.loss_P[idx]}


APPROACH1_MIN_SPAN = 1.5  # the inner envelope points' largest / smallest compute below which approach 1 does not fit


def approach1(points: Points) -> dict[str, Any]:
    """Power laws N_opt ∝ C^a, D_opt ∝ C^b fitted to the loss envelope (curves or final points).

    Envelope points reached by the smallest or largest model size are left out of the fit: there
    the optimum may lie beyond the sampled sizes.
    """
    env = envelope(points)
    sizes = [c.params for c in points.curves] if points.curves else list(points.params_P)
    at_edge_G = (env["params"] <= min(sizes)) | (env["params"] >= max(sizes))
    inner = {k: v[~at_edge_G] for k, v in env.items()}
    record = {
        "envelope_from": "loss curves" if points.curves else "final points",
        "envelope": {**{k: v.tolist() for k, v in env.items()}, "at_edge": at_edge_G.tolist()},
        "envelope_left_out": f"{int(at_edge_G.sum())} of {len(at_edge_G)} envelope points reached by "
                             "the smallest or largest model size",
        "points_used": list(points.ids), "points_excluded": list(points.excluded),
    }
    if len(np.unique(inner["params"])) < 2:
        return {**record, "a": None, "b": None,
                "note": "the loss envelope holds fewer than 2 inner model sizes; approach 1 needs more"}
    if np.ptp(np.log(inner["flops"])) < np.log(APPROACH1_MIN_SPAN):  # e.g. two sizes of one IsoFLOP budget
        return {**record, "a": None, "b": None,
                "note": f"the loss envelope's inner points span less than {APPROACH1_MIN_SPAN:g}× in compute (one "
                        "budget); approach 1 needs inner points from budgets further apart"}
    a, n_coef = power_law(inner["flops"], inner["params"])
    b, d_coef = power_law(inner["flops"], inner["tokens"])
    return {"a": a, "b": b, "N_coef": n_coef, "D_coef": d_coef, **record}


# ---------------------------------------------------------------- Approach 3


def _loss_fit_dict(fit: parametric.LossFit) -> dict[str, Any]:
    values = {"E": fit.E, "A": fit.A, "B": fit.B, "alpha": fit.alpha, "beta": fit.beta}
    if not all(np.isfinite(v) for v in values.values()):  # the fit ran off (too few or too noisy points)
        return {**{k: None for k in values}, "objective": fit.objective,
                "a": None, "b": None, "note": "the parametric fit overflowed (a coefficient is not finite)"}
    out: dict[str, Any] = {**values, "objective": fit.objective}
    if fit.alpha > 0 and fit.beta > 0 and np.isfinite(fit.G) and fit.G > 0:
        out.update(a=fit.a, b=fit.b, G=fit.G, N_coef=fit.G * 6.0 ** -fit.a,
                   D_coef=6.0 ** -fit.b / fit.G)
    else:
        out.update(a=None, b=None, note="α or β is not positive (or the fit degenerated, G=0): no "
                                        "compute-optimal allocation")
    return out


def near_optimum(points: Points, approach2_result: dict[str, Any], near: float) -> tuple[np.ndarray, str]:
    """Which points approach 3 fits: those within a factor `near` in N of their budget's optimum (the
    budget's approach-2 minimum, else the approach-2 power law at its C); all where there is neither."""
    if not near:
        return np.ones(len(points), bool), "all points (approach3_near=0)"
    if approach2_result.get("a") is None:
        return np.ones(len(points), bool), "all points (approach 2 gives no optimum to centre on)"
    n_opt_by_id = {i: b["N_opt"] for b in approach2_result["budgets"] for i in b["ids"]}
    keep_P = np.zeros(len(points), bool)
    for idx in group_budgets(points.flops_P, budget_P=points.budget_P):
        c = float(np.exp(np.mean(np.log(points.flops_P[idx]))))
        with np.errstate(over="ignore"):  # (an overflow leaves the budget out of the selection)
            n_opt = n_opt_by_id.get(points.ids[idx[0]], approach2_result["N_coef"] * np.float64(c) ** approach2_result["a"])
        keep_P[idx] = np.abs(np.log(points.params_P[idx] / n_opt)) <= np.log(near)
    if keep_P.sum() < 5:
        return np.ones(len(points), bool), f"all points (fewer than 5 within {near:g}x of an optimum)"
    return keep_P, f"points within {near:g}x in N of their budget's optimum (approach 2)"


def residual_report(fit: dict[str, Any], points: Points, sigma: float | None) -> dict[str, Any]:
    """ln L − ln L̂ per fitted point, their RMS and max, points beyond RESIDUAL_FLAG·σ, and whether the
    RMS is within 2σ (the form fits the points to their noise)."""
    if fit.get("E") is None:
        return {}
    pred_P = parametric.law_loss(*(fit[k] for k in ("E", "A", "B", "alpha", "beta")), points.params_P, points.tokens_P)
    r_P = np.log(points.loss_P) - np.log(pred_P)
    rms = float(np.sqrt(np.mean(r_P**2)))
    out: dict[str, Any] = {"residuals": {i: float(r) for i, r in zip(points.ids, r_P)},
                           "residual_rms": rms, "residual_max": float(np.abs(r_P).max())}
    if sigma:
        out["beyond_noise"] = [i for i, r in zip(points.ids, r_P) if abs(r) > RESIDUAL_FLAG * sigma]
        out["form_fits"] = bool(rms <= 2 * sigma)
        if not out["form_fits"]:
            out["warning"] = (f"residual RMS {rms:.4f} is {rms / sigma:.1f}x the loss noise σ {sigma:.4f}: "
                              "L(N, D) = E + A/N^α + B/D^β does not describe these points to their noise")
    return out


def approach3(points: Points, **fit_kwargs: Any) -> dict[str, Any]:
    """The parametric fit L(N, D) = E + A/N^α + B/D^β (see `parametric.fit_loss`)."""
    if len(points) < 5:
        return {**_unfitted(f"{len(points)} points; approach 3 needs at least 5", points),
                "E": None, "A": None, "B": None, "alpha": None, "beta": None}
    fit = parametric.fit_loss(points.params_P, points.tokens_P, points.loss_P, **fit_kwargs)
    return {**_loss_fit_dict(fit), "points_used": list(points.ids),
            "points_excluded": list(points.excluded)}


# ---------------------------------------------------------------- noise bootstrap and the whole fit


def approach2_draws(result: dict[str, Any], sigma: float, samples: int,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Approach 2 refitted under `samples` loss-noise draws: a, b, N_coef, D_coef (K,) and the budgets'
    C_opt, N_opt, D_opt, loss_opt (B, K)."""
    minima = isoflop.resample_minima(result, sigma, samples, rng)
    return {**minima, **isoflop.power_laws(minima["C_opt"], minima["N_opt"], minima["D_opt"])}


def approach3_draws(points: Points, fitted: dict[str, Any], sigma: float, samples: int,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Approach 3 refitted on `samples` draws L̂(N, D)·exp(σz) around its own fitted losses (a parametric
    bootstrap; all draws at once, `parametric.fit_batch`, each from the fit's solution and its own best cell of the
    coarse profile grid)."""
    warm = parametric.LossFit(**{k: fitted[k] for k in ("E", "A", "B", "alpha", "beta")}, objective=np.nan)
    keys = ("a", "b", "E", "A", "B", "alpha", "beta", "N_coef", "D_coef")
    draws: dict[str, list[float]] = {k: [] for k in keys}
    fitted_P = warm.loss(points.params_P, points.tokens_P)
    loss_KP = noise.draw_losses(fitted_P, sigma, samples, rng)
    for fit_k in parametric.fit_batch(points.params_P, points.tokens_P, loss_KP, warm_start=warm):
        fit = _loss_fit_dict(fit_k)
        for k in keys:
            draws[k].append(np.nan if fit.get(k) is None else float(fit[k]))
    return {k: np.array(v) for k, v in draws.items()}


def drop_highest_loss(points: Points, k: int) -> Points:
    """Leave out the k highest-loss points (Besiroglu et al. 2024's outlier rule)."""
    if not 0 <= k < len(points):
        raise ConfigError(f"drop_highest={k} is not valid; choose 0 ≤ K < {len(points)} (the number of points)")
    keep_P = np.ones(len(points), dtype=bool)
    keep_P[np.argsort(points.loss_P, kind="stable")[len(points) - k :]] = False
    return points.subset(keep_P, reason=f"among the {k} highest losses (drop_highest={k})")


def approach3_near_optimum(points: Points, a2: dict[str, Any], near: float, sigma: float | None,
                           **fit_kwargs: Any) -> tuple[dict[str, Any], Points]:
    """Approach 3 fitted to the points `near_optimum` keeps (its `selection` says which), with its residual
    report against the noise σ `sigma`; returns (the approach-3 record, the points it fitted)."""
    keep_P, selection = near_optimum(points, a2, near)
    chosen = points.subset(keep_P, reason=f"further than {near:g}x in N from its budget's optimum")
    a3 = approach3(chosen, **fit_kwargs)
    a3["selection"] = selection
    if a3.get("E") is not None:
        a3.update(residual_report(a3, chosen, sigma))
    return a3, chosen


def fit_all(
    points: Points, *, drop_highest: int = 0, bootstrap: int = 0, seed: int = 0,
    isoflop_window: int | None = None, isoflop_method: str | None = None, headline: str | None = None,
    predict_flops: Sequence[float] = (), approach3_near: float = APPROACH3_NEAR,
    predict_points: Sequence[tuple[float, float]] = (),
) -> dict[str, Any]:
    """The fit.json content.

    Approaches 1–3 under the headline convention (`conventions`; None: the first available), approach 2
    (and 3's a) under every convention, the loss noise σ, the frontier L_opt(C) = E + k·C^-γ and, for
    `predict_flops`, predictions. `bootstrap` > 0: that many loss-noise draws give 95% intervals (200
    are drawn when predictions are asked for without it). `isoflop_window`/`isoflop_method`: see
    `isoflop.approach2`. `approach3_near`: see `near_optimum` (0: all points). `predict_points`: (N, D) pairs
    whose loss approach 3 or Gadre et al.'s over-training form predicts, both fitted to the points approach 3 fits
    (whichever does better in the backtests by model size and by tokens per parameter), with intervals that grow
    with the distance of extrapolation (`at_points`), calibrated with the default `approach3_near`.
    """
    if bootstrap < 0:
        raise ConfigError(f"bootstrap={bootstrap} is not valid; choose 0 (off) or a positive sample count")
    if any(not (np.isfinite(c) and c > 0) for c in predict_flops):
        raise ConfigError(f"predict_flops={list(predict_flops)} is not valid; give positive FLOP counts")
    points = points.canonical()  # results independent of the order of the rows
    used = drop_highest_loss(points, drop_highest)
    names = conventions.available(used)
    headline = headline or names[0]
    if headline not in names:
        raise ConfigError(f"headline={headline!r} is not valid for these points; available: {', '.join(names)}")
    samples = bootstrap or (200 if predict_flops else 0)
    rng = np.random.default_rng(seed)
    sigma = noise.estimate(used)
    kind = interval.noise_kind(sigma)  # the intervals' noise source
    main = conventions.apply(used, headline)
    a2 = approach2(main, isoflop_window, method=isoflop_method)
    a3, chosen = approach3_near_optimum(main, a2, approach3_near, sigma["sigma"])
    result: dict[str, Any] = {
        "source": points.source,
        "options": {"drop_highest": drop_highest, "bootstrap": samples, "seed": seed,
                    "isoflop_window": isoflop_window, "isoflop_method": a2["method"],
                    "approach3_near": approach3_near, "predict_flops": [float(c) for c in predict_flops]},
        "headline": {"convention": headline, "definition": conventions.DESCRIPTIONS[headline],
                     "why": conventions.HEADLINE_WHY.get(headline, "chosen with headline=")},
        "noise": sigma,
        "points": main.as_records(),
        "points_excluded": list(used.excluded),
        "input_notes": list(points.notes),
        "approach1": approach1(main),
        "approach2": a2,
        "approach3": a3,
    }
    draws2 = None
    if samples and sigma["sigma"] and a2.get("a") is not None:
        draws2 = approach2_draws(a2, sigma["sigma"], samples, rng)
        a2.update(interval.of_draws(draws2, ("a", "b", "N_coef", "D_coef"), kind))
        a2["bootstrap"] = {"kind": "parametric: losses redrawn with the noise σ", "samples": samples,
                           "budget_minima_clamped": int(draws2["clamped"].sum()),
                           "draws": draw_lists(draws2, ("a", "b", "N_coef", "D_coef"))}
    if samples and sigma["sigma"] and a3.get("a") is not None:
        # Where the form misfits (residual RMS > σ), the draws use the residual RMS: the interval then
        # carries the misfit too, not only the noise.
        sigma3 = max(sigma["sigma"], a3["residual_rms"])
        source3 = kind if sigma3 == sigma["sigma"] else "fit_residuals"
        draws3 = approach3_draws(chosen, a3, sigma3, samples, rng)
        a3.update(interval.of_draws(draws3, tuple(draws3), source3))
        a3["bootstrap"] = {"kind": "parametric: fitted losses redrawn with σ = max(noise σ, residual RMS)",
                           "sigma": sigma3, "source": source3, "samples": samples,
                           "failed": int(np.isnan(draws3["a"]).sum()),
                           "draws": draw_lists(draws3)}
    result["conventions"] = _conventions(used, names, headline, a2, a3, isoflop_window, isoflop_method,
                                         approach3_near, sigma["sigma"], samples, rng, kind)
    if {"params_non_embedding", "params_total"} <= set(used.extra_P):  # the runs' share outside the embeddings
        share = used.extra_P["params_non_embedding"] / used.extra_P["params_total"]
        result["non_embedding_share"] = {"min": float(share.min()), "max": float(share.max())}
    result["frontier"], predictions = frontier.with_predictions(a2, draws2, a3, predict_flops, kind,
                                                                refits.backtest_e(chosen, a2, a3))
    stability = refits.leave_one_budget_out(chosen, a2, a3, result["frontier"], predict_flops)
    if stability is not None:
        result["frontier"]["sensitivity"] = stability
    if predict_flops:
        result["predictions"] = predictions
    if predict_points:
        result["point_predictions"] = at_points.predict(chosen, predict_points, sigma["sigma"], a3)
        if approach3_near != APPROACH3_NEAR:
            result["point_predictions"]["note"] = (
                f"fitted to {a3['selection']}; the interval multipliers were calibrated with the default "
                f"approach3_near={APPROACH3_NEAR:g} (point_interval.CALIBRATION)")
    return result


def _conventions(used: Points, names: list[str], headline: str, a2: dict[str, Any], a3: dict[str, Any],
                 window: int | None, method: str | None, near: float, sigma: float | None, samples: int,
                 rng: np.random.Generator, kind: str) -> dict[str, Any]:
    """a and b of approach 2 (with intervals) and approach 3 under each convention."""
    out = {}
    for name in names:
        if name == headline:
            c2, c3 = a2, a3
        else:
            pts = conventions.apply(used, name)
            c2 = approach2(pts, window, method=method)
            c3, _ = approach3_near_optimum(pts, c2, near, sigma)
            if samples and sigma and c2.get("a") is not None:
                c2 = {**c2, **interval.of_draws(approach2_draws(c2, sigma, samples, rng), ("a", "b"), kind)}
        out[name] = {"definition": conventions.DESCRIPTIONS[name],
                     "approach2": {k: c2.get(k) for k in ("a", "b", "a_ci95", "b_ci95", "note") if k in c2},
                     "approach3": {k: c3.get(k) for k in ("a", "b", "note") if k in c3}}
    return out
