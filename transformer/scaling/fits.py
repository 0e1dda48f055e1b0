"""Compute-optimal scaling fits: Chinchilla Approaches 1, 2 and 3 (Hoffmann et al. 2022).

Legend: P = points, G = compute grid values, K = bootstrap samples.

Each approach returns a JSON-ready dict with the exponents `a` (N_opt ∝ C^a) and `b` (D_opt ∝ C^b),
the prefactors `N_coef`, `D_coef` (N_opt = N_coef·C^a, D_opt = D_coef·C^b), the ids of the points
used and excluded (with reasons), and a `note` instead of numbers when it cannot be fitted.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from transformer.models.config import ConfigError
from transformer.scaling import parametric
from transformer.scaling.points import Points

BUDGET_RTOL = 0.01  # points whose compute agrees within 1% belong to one IsoFLOP budget
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
    a, n_coef = power_law(inner["flops"], inner["params"])
    b, d_coef = power_law(inner["flops"], inner["tokens"])
    return {"a": a, "b": b, "N_coef": n_coef, "D_coef": d_coef, **record}


# ---------------------------------------------------------------- Approach 2


def group_budgets(flops_P: np.ndarray, rtol: float = BUDGET_RTOL,
                  budget_P: np.ndarray | None = None) -> list[np.ndarray]:
    """Indices of the points in each IsoFLOP budget: the sweep's designed `budget_P` where given (runs
    of one budget may differ by more than 1% in measured FLOPs), else compute within `rtol` of the
    budget's smallest (CSV points)."""
    if budget_P is not None:
        return [np.flatnonzero(budget_P == b) for b in np.unique(budget_P)]
    order_P = np.argsort(flops_P, kind="stable")
    groups: list[list[int]] = []
    for i in order_P:
        if groups and flops_P[i] <= flops_P[groups[-1][0]] * (1 + rtol):
            groups[-1].append(int(i))
        else:
            groups.append([int(i)])
    return [np.array(g) for g in groups]


def isoflop_minimum(points: Points, idx: np.ndarray, window: int | None = None) -> dict[str, Any]:
    """A parabola in log N through one budget's losses; its minimum, or why there is none.

    `window`: fit only the sampled size with the lowest loss and its `window` neighbours on each
    side (a local parabola, less biased when the sizes span far beyond the minimum); None: all.
    """
    idx = idx[np.argsort(points.params_P[idx], kind="stable")]
    flops = float(np.exp(np.mean(np.log(points.flops_P[idx]))))
    log_n = np.log(points.params_P[idx])
    loss = points.loss_P[idx]
    budget: dict[str, Any] = {"flops": flops, "ids": [points.ids[i] for i in idx],
                              "params": points.params_P[idx].tolist(), "loss": loss.tolist()}
    sizes = len(np.unique(log_n))
    if sizes < 3:
        return {**budget, "reason": f"{sizes} model size(s); a parabola needs at least 3"}
    best = int(np.argmin(loss))
    if log_n[best] in (log_n[0], log_n[-1]):
        return {**budget, "reason": "the lowest loss is at the smallest or largest sampled size"}
    fit = slice(0, len(idx)) if window is None else slice(max(0, best - window), best + window + 1)
    if len(np.unique(log_n[fit])) < 3:
        return {**budget, "reason": f"fewer than 3 sizes within window={window} of the lowest loss"}
    c2, c1, c0 = np.polyfit(log_n[fit], loss[fit], 2)
    budget["parabola"] = [float(c2), float(c1), float(c0)]  # loss = c2·x² + c1·x + c0, x = ln N
    budget["fit_range"] = [float(np.exp(log_n[fit][0])), float(np.exp(log_n[fit][-1]))]
    if c2 <= 0:
        return {**budget, "reason": "the parabola opens downwards (no minimum)"}
    x_opt = -c1 / (2 * c2)
    if not (log_n[0] < x_opt < log_n[-1]):
        return {**budget, "reason": "the parabola's minimum lies outside the sampled sizes"}
    # D at the optimum from the budget's own log D–log N line (= C/(6 N_opt) when C = 6·N·D).
    s, k = np.polyfit(log_n, np.log(points.tokens_P[idx]), 1)
    return {**budget, "N_opt": float(np.exp(x_opt)), "D_opt": float(np.exp(s * x_opt + k)),
            "loss_opt": float(c0 - c1**2 / (4 * c2))}


def approach2(points: Points, window: int | None = None, rtol: float = BUDGET_RTOL) -> dict[str, Any]:
    """IsoFLOP parabolas per budget (see `isoflop_minimum`), then power laws through their minima.

    Budgets group points whose compute agrees within `rtol`.
    """
    budgets = [isoflop_minimum(points, idx, window) for idx in group_budgets(points.flops_P, rtol, points.budget_P)]
    kept = [b for b in budgets if "N_opt" in b]
    dropped = [b for b in budgets if "N_opt" not in b]
    excluded = list(points.excluded) + [
        {"id": i, "reason": f"budget C={b['flops']:.3g}: {b['reason']}"} for b in dropped for i in b["ids"]
    ]
    result: dict[str, Any] = {
        "window": window, "budgets": kept, "budgets_excluded": dropped,
        "points_used": [i for b in kept for i in b["ids"]], "points_excluded": excluded,
    }
    if len(kept) < 2:
        return {**result, "a": None, "b": None,
                "note": f"{len(kept)} usable IsoFLOP budget(s); approach 2 needs at least 2"}
    flops = np.array([b["flops"] for b in kept])
    a, n_coef = power_law(flops, np.array([b["N_opt"] for b in kept]))
    b_exp, d_coef = power_law(flops, np.array([b["D_opt"] for b in kept]))
    if not np.all(np.isfinite([a, b_exp, n_coef, d_coef])):
        return {**result, "a": None, "b": None, "note": "the power-law fit through the minima overflowed"}
    return {"a": a, "b": b_exp, "N_coef": n_coef, "D_coef": d_coef, **result}


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


def approach3(points: Points, **fit_kwargs: Any) -> dict[str, Any]:
    """The parametric fit L(N, D) = E + A/N^α + B/D^β (see `parametric.fit_loss`)."""
    if len(points) < 5:
        return {**_unfitted(f"{len(points)} points; approach 3 needs at least 5", points),
                "E": None, "A": None, "B": None, "alpha": None, "beta": None}
    fit = parametric.fit_loss(points.params_P, points.tokens_P, points.loss_P, **fit_kwargs)
    return {**_loss_fit_dict(fit), "points_used": list(points.ids),
            "points_excluded": list(points.excluded)}


# ---------------------------------------------------------------- bootstrap and the whole fit


def bootstrap_intervals(
    points: Points, refit: Callable[[Points], dict[str, Any]], keys: tuple[str, ...],
    samples: int, rng: np.random.Generator,
) -> dict[str, Any]:
    """Refit on `samples` resamples (with replacement) of the points; 95% percentile intervals."""
    draws: dict[str, list[float]] = {k: [] for k in keys}
    failed = 0
    for _ in range(samples):
        fit = refit(points.take(rng.integers(0, len(points), len(points))))
        if any(fit.get(k) is None or not np.isfinite(fit[k]) for k in keys):
            failed += 1
            continue
        for k in keys:
            draws[k].append(float(fit[k]))
    out: dict[str, Any] = {"bootstrap": {"samples": samples, "failed": failed, "draws": draws}}
    if samples - failed >= 2:
        for k in keys:
            lo, hi = np.percentile(draws[k], [2.5, 97.5])
            out[f"{k}_ci95"] = [float(lo), float(hi)]
    return out


def drop_highest_loss(points: Points, k: int) -> Points:
    """Leave out the k highest-loss points (Besiroglu et al. 2024's outlier rule)."""
    if not 0 <= k < len(points):
        raise ConfigError(f"drop_highest={k} is not valid; choose 0 ≤ K < {len(points)} (the number of points)")
    keep_P = np.ones(len(points), dtype=bool)
    keep_P[np.argsort(points.loss_P, kind="stable")[len(points) - k :]] = False
    return points.subset(keep_P, reason=f"among the {k} highest losses (drop_highest={k})")


def fit_all(
    points: Points, *, drop_highest: int = 0, bootstrap: int = 0, seed: int = 0,
    isoflop_window: int | None = None,
) -> dict[str, Any]:
    """The fit.json content: the three approaches on `points`, with bootstrap intervals if asked.

    `isoflop_window` is Approach 2's `window` (None: each parabola through all of its budget).
    """
    if bootstrap < 0:
        raise ConfigError(f"bootstrap={bootstrap} is not valid; choose 0 (off) or a positive sample count")
    used = drop_highest_loss(points, drop_highest)
    result: dict[str, Any] = {
        "source": points.source,
        "options": {"drop_highest": drop_highest, "bootstrap": bootstrap, "seed": seed,
                    "isoflop_window": isoflop_window},
        "points": used.as_records(),
        "points_excluded": list(used.excluded),
        "approach1": approach1(used),
        "approach2": approach2(used, isoflop_window),
        "approach3": approach3(used),
    }
    if bootstrap:
        rng = np.random.default_rng(seed)
        fitted2, fitted3 = result["approach2"], result["approach3"]
        if fitted2.get("a") is not None:
            fitted2.update(bootstrap_intervals(
                used, lambda p: approach2(p, isoflop_window), ("a", "b", "N_coef", "D_coef"), bootstrap, rng))
        if fitted3.get("a") is not None:
            best_5 = np.array([[np.log(fitted3["A"]), np.log(fitted3["B"]), np.log(fitted3["E"]),
                                fitted3["alpha"], fitted3["beta"]]])
            keys3 = ("a", "b", "E", "A", "B", "alpha", "beta", "N_coef", "D_coef")
            fitted3.update(bootstrap_intervals(
                used, lambda p: approach3(p, n_starts=5, extra_starts=best_5), keys3, bootstrap, rng))
    return result

