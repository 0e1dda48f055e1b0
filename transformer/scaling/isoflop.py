"""Chinchilla Approach 2: each IsoFLOP budget's loss minimum over model size, then power laws through them.

Legend: P = points, S = distinct model sizes of one budget, G = grid values in ln N, K = noise draws,
B = budgets.

Per budget, seed replicates (points of one budget with equal N and D) are averaged in log loss first.
The minimum is then found by one of two methods:
- `akima` (default): Akima interpolation of ln L against ln N through every size of the budget, its
  minimum on a grid of 25 values per interval between sampled sizes (Porian et al. 2024). It is local by
  construction: each piece depends only on the nearest sizes, so sizes far from the optimum (where a
  parabola in ln N no longer holds) do not move it.
- `parabola`: a parabola in ln N through ln L of the lowest-loss size and `window` sizes each side (None:
  every size), its vertex (Hoffmann et al. 2022).
A budget whose lowest loss is at its smallest or largest size, or whose fitted minimum is not inside the
sampled sizes, is left out with the reason. (Porian et al. keep a budget whose lowest loss is at an end when
the interpolation dips just inside it; such a dip is an artefact of the end slopes, and the optimum may lie
beyond the sizes: on their points the stricter rule moves no exponent by more than 0.02.) D and C at the optimum come from the budget's own ln D–ln N and
ln C–ln N lines (C = 6·N·D in the convention's N, see `conventions`).

Everything that the noise bootstrap repeats takes losses as (S, K) columns, so K draws cost one call.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from scipy.interpolate import Akima1DInterpolator

from transformer.spec import ConfigError
from transformer.scaling.points import Points

BUDGET_RTOL = 0.01  # CSV points whose compute agrees within 1% belong to one IsoFLOP budget
# Approach 2's power laws need budgets that span at least this factor in compute: one budget whose measured FLOPs
# jitter by more than BUDGET_RTOL splits into "budgets" a few % apart (the law through their minima had a = 17); the
# closest budgets of published grids are 1.2x apart (Open-Athena's Llama 3 set), a test grid's 1.3x.
MIN_BUDGET_SPAN = 1.15
GRID_PER_INTERVAL = 25  # Akima grid values per interval between sampled sizes (as Porian et al.)
METHODS = ("akima", "parabola")
CURVE_POINTS = 100  # samples of the fitted curve stored for the plots


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


SIZE_RTOL = 0.01  # sizes of one budget within 1% in N are one size (near-duplicates, e.g. digitised points)


def size_index(points: Points, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which distinct size each of a budget's points is: (inverse (P,), replicates (S,)), sizes in increasing N.
    Points of one budget whose N agree within SIZE_RTOL of the size's smallest are one size: seed replicates (their
    D is C/(6N) too), or near-duplicates that an interpolation through both would turn into a spike."""
    log_n_P = np.log(points.params_P[idx])
    order_P = np.argsort(log_n_P, kind="stable")
    inverse_P = np.empty(len(idx), dtype=int)
    size, start = -1, -np.inf
    for i in order_P:
        if log_n_P[i] > start + np.log1p(SIZE_RTOL):
            size, start = size + 1, log_n_P[i]
        inverse_P[i] = size
    return inverse_P, np.bincount(inverse_P)


def sizes(points: Points, idx: np.ndarray) -> dict[str, np.ndarray]:
    """One budget's distinct sizes, increasing: ln N, mean ln L and replicate count, (S,)."""
    inverse_P, reps_S = size_index(points, idx)
    mean = lambda v_P: np.bincount(inverse_P, weights=v_P) / reps_S  # noqa: E731
    return {"log_n": mean(np.log(points.params_P[idx])), "log_loss": mean(np.log(points.loss_P[idx])),
            "reps": reps_S}


def window_slice(y_S: np.ndarray, window: int | None) -> slice:
    """The lowest-loss size and `window` sizes on each side (None: all)."""
    if window is None:
        return slice(0, len(y_S))
    best = int(np.argmin(y_S))
    return slice(max(0, best - window), best + window + 1)


def minima(log_n_S: np.ndarray, y_SK: np.ndarray, method: str, fit: slice) -> tuple[np.ndarray, ...]:
    """The minimum of each column of ln L (y_SK) over ln N: (x_K, y_K, inside_K); where the minimum is
    not inside the sampled sizes, x_K is clamped to the nearest end and inside_K is False."""
    K = y_SK.shape[1]
    if method == "akima":
        grid_G = np.linspace(log_n_S[0], log_n_S[-1], (len(log_n_S) - 1) * GRID_PER_INTERVAL)
        f_GK = Akima1DInterpolator(log_n_S, y_SK, axis=0)(grid_G)
        i_K = np.argmin(f_GK, axis=0)
        return grid_G[i_K], f_GK[i_K, np.arange(K)], (i_K > 0) & (i_K < len(grid_G) - 1)
    x_S = log_n_S[fit]
    c2_K, c1_K, c0_K = np.polyfit(x_S, y_SK[fit], 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        vertex_K = -c1_K / (2 * c2_K)
    inside_K = (c2_K > 0) & (vertex_K > log_n_S[0]) & (vertex_K < log_n_S[-1])
    lowest_K = log_n_S[np.argmin(y_SK, axis=0)]
    x_K = np.where(inside_K, vertex_K, np.clip(np.nan_to_num(vertex_K, nan=0.0), log_n_S[0], log_n_S[-1]))
    x_K = np.where((c2_K > 0) | inside_K, x_K, lowest_K)
    return x_K, c2_K * x_K**2 + c1_K * x_K + c0_K, inside_K


def _curve(log_n_S: np.ndarray, y_S: np.ndarray, method: str, fit: slice) -> dict[str, list[float]]:
    """The fitted curve over the sizes it was fitted to, for the plots."""
    x_G = np.linspace(log_n_S[fit][0], log_n_S[fit][-1], CURVE_POINTS)
    if method == "akima":
        y_G = Akima1DInterpolator(log_n_S, y_S)(x_G)
    else:
        y_G = np.polyval(np.polyfit(log_n_S[fit], y_S[fit], 2), x_G)
    return {"params": np.exp(x_G).tolist(), "loss": np.exp(y_G).tolist()}


def budget_minimum(points: Points, idx: np.ndarray, method: str = "akima",
                   window: int | None = None) -> dict[str, Any]:
    """One budget's minimum (see the module docstring), or the reason there is none."""
    idx = idx[np.argsort(points.params_P[idx], kind="stable")]
    s = sizes(points, idx)
    budget: dict[str, Any] = {
        "flops": float(np.exp(np.mean(np.log(points.flops_P[idx])))), "ids": [points.ids[i] for i in idx],
        "params": points.params_P[idx].tolist(), "loss": points.loss_P[idx].tolist(), "method": method,
        "sizes": np.exp(s["log_n"]).tolist(), "size_loss": np.exp(s["log_loss"]).tolist(),
        "replicates": s["reps"].tolist(),
    }
    log_n_S, y_S = s["log_n"], s["log_loss"]
    if len(log_n_S) < 3:
        return {**budget, "reason": f"{len(log_n_S)} model size(s); a minimum needs at least 3"}
    if int(np.argmin(y_S)) in (0, len(y_S) - 1):
        return {**budget, "reason": "the lowest loss is at the smallest or largest sampled size"}
    fit = window_slice(y_S, window if method == "parabola" else None)
    if len(log_n_S[fit]) < 3:
        return {**budget, "reason": f"fewer than 3 sizes within window={window} of the lowest loss"}
    budget["fit_range"] = [float(np.exp(log_n_S[fit][0])), float(np.exp(log_n_S[fit][-1]))]
    budget["fit_slice"] = [fit.start, min(fit.stop, len(log_n_S))]
    budget["curve"] = _curve(log_n_S, y_S, method, fit)
    x_K, y_K, inside_K = minima(log_n_S, y_S[:, None], method, fit)
    if not inside_K[0]:
        return {**budget, "reason": "the fitted minimum lies at or beyond the smallest or largest sampled size"}
    log_c_P = np.log(points.flops_P[idx])
    budget["d_line"] = np.polyfit(np.log(points.params_P[idx]), np.log(points.tokens_P[idx]), 1).tolist()
    budget["c_line"] = np.polyfit(np.log(points.params_P[idx]), log_c_P, 1).tolist() \
        if np.ptp(log_c_P) > 0 else [0.0, float(log_c_P[0])]
    return {**budget, **at_optimum(budget, x_K[0]), "loss_opt": float(np.exp(y_K[0]))}


def at_optimum(budget: dict[str, Any], x: np.ndarray | float) -> dict[str, Any]:
    """N_opt, D_opt and C_opt at ln N = x from the budget's ln D and ln C lines (arrays for arrays)."""
    s_d, k_d = budget["d_line"]
    s_c, k_c = budget["c_line"]
    n, d, c = np.exp(x), np.exp(s_d * np.asarray(x) + k_d), np.exp(s_c * np.asarray(x) + k_c)
    if np.ndim(x) == 0:
        return {"N_opt": float(n), "D_opt": float(d), "C_opt": float(c)}
    return {"N_opt": n, "D_opt": d, "C_opt": c}


def slopes(x_BK: np.ndarray, y_BK: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares slope and intercept of y on x, column by column: (K,), (K,)."""
    xm_K, ym_K = x_BK.mean(axis=0), y_BK.mean(axis=0)
    slope_K = ((x_BK - xm_K) * (y_BK - ym_K)).sum(axis=0) / ((x_BK - xm_K) ** 2).sum(axis=0)
    return slope_K, ym_K - slope_K * xm_K


def power_laws(c_BK: np.ndarray, n_BK: np.ndarray, d_BK: np.ndarray) -> dict[str, np.ndarray]:
    """N_opt = N_coef·C^a and D_opt = D_coef·C^b through the minima, per column: each (K,)."""
    log_c_BK = np.log(c_BK)
    a_K, ln_n_K = slopes(log_c_BK, np.log(n_BK))
    b_K, ln_d_K = slopes(log_c_BK, np.log(d_BK))
    with np.errstate(over="ignore"):
        return {"a": a_K, "b": b_K, "N_coef": np.exp(ln_n_K), "D_coef": np.exp(ln_d_K)}


def approach2(points: Points, window: int | None = None, rtol: float = BUDGET_RTOL,
              method: str | None = None) -> dict[str, Any]:
    """Per-budget minima, then power laws through them. `method` None: `parabola` when `window` is
    given, else `akima`."""
    method = method or ("parabola" if window is not None else "akima")
    if method not in METHODS:
        raise ConfigError(f"isoflop_method={method!r} is not valid; choose one of {', '.join(METHODS)}")
    groups = group_budgets(points.flops_P, rtol, points.budget_P)
    budgets = [budget_minimum(points, idx, method, window) for idx in groups]
    kept = [b for b in budgets if "N_opt" in b]
    dropped = [b for b in budgets if "N_opt" not in b]
    span = max(b["flops"] for b in kept) / min(b["flops"] for b in kept) if kept else 1.0
    narrow = None
    if len(kept) > 1 and span < MIN_BUDGET_SPAN:  # no power law (nor frontier) through them
        narrow = (f"the {len(kept)} budgets with a minimum span {span:.3g}x in compute; approach 2 needs budgets at "
                  f"least {MIN_BUDGET_SPAN:g}x apart (one budget whose measured FLOPs differ by more than "
                  f"{100 * rtol:g}% splits into several: give each run's designed budget in the flops column)")
        dropped, kept = dropped + [{**b, "reason": narrow} for b in kept], []
    excluded = list(points.excluded) + [
        {"id": i, "reason": f"budget C={b['flops']:.3g}: {b['reason']}"} for b in dropped for i in b["ids"]
    ]
    result: dict[str, Any] = {
        "method": method, "window": window if method == "parabola" else None,
        "budgets": kept, "budgets_excluded": dropped,
        "points_used": [i for b in kept for i in b["ids"]], "points_excluded": excluded,
    }
    if narrow:
        return {**result, "a": None, "b": None, "note": narrow}
    if len(kept) < 2:
        note = f"{len(kept)} usable IsoFLOP budget(s); approach 2 needs at least 2"
        if not points.flops_given:
            note += (f" ({len(budgets)} groups of points of equal compute): the points have no flops column, so "
                     "each one's compute is 6·N·D, and points form one IsoFLOP budget only where that agrees within "
                     f"{100 * rtol:g}%; add a flops column giving each run's budget (one value per IsoFLOP curve)")
        return {**result, "a": None, "b": None, "note": note}
    laws = power_laws(*(np.array([[b[k]] for b in kept]) for k in ("C_opt", "N_opt", "D_opt")))
    values = {k: float(v[0]) for k, v in laws.items()}
    if not all(np.isfinite(v) for v in values.values()):
        return {**result, "a": None, "b": None, "note": "the power-law fit through the minima overflowed"}
    return {**values, **result}


def resample_minima(result: dict[str, Any], sigma: float, samples: int,
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The kept budgets' minima under `samples` draws of loss noise: each size's mean ln L moves by
    N(0, σ²/replicates). Returns C_opt, N_opt, D_opt, loss_opt as (B, K) and `clamped` (B,): draws
    whose minimum left the sampled sizes (clamped to the end)."""
    out: dict[str, list[np.ndarray]] = {"C_opt": [], "N_opt": [], "D_opt": [], "loss_opt": [], "clamped": []}
    for budget in result["budgets"]:
        log_n_S = np.log(budget["sizes"])
        y_S = np.log(budget["size_loss"])
        noise_SK = rng.normal(0.0, 1.0, (len(y_S), samples)) * (sigma / np.sqrt(budget["replicates"]))[:, None]
        fit = slice(*budget["fit_slice"])
        x_K, y_K, inside_K = minima(log_n_S, y_S[:, None] + noise_SK, result["method"], fit)
        for k, v in at_optimum(budget, x_K).items():
            out[k].append(v)
        out["loss_opt"].append(np.exp(y_K))
        out["clamped"].append(np.array(int((~inside_K).sum())))
    return {k: np.array(v) for k, v in out.items()}
