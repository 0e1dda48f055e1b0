"""The frontier refitted on subsets of the budgets: approach 3's E for each backtest origin (the first k budgets
alone), and the forecast's leave-one-budget-out stability.

Legend: B = budget minima, P = points, K = refits fitted at once, Q = prediction budgets.

Both need approach 3 refitted on a subset of its points (`approach3_e`): all subsets at once, one batch of
`parametric.fit_batch` (the variable-projection grid, then Levenberg–Marquardt), so a fit with ten budgets adds
about twenty small approach-3 fits in one call.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from transformer.scaling import allocation, frontier, isoflop, parametric
from transformer.scaling.points import Points

REFERENCE_FACTOR = 4.0  # without prediction budgets, the stability is measured at this many times the largest budget


def _budget_flops(points: Points, approach2: dict[str, Any]) -> np.ndarray:
    """Each point's IsoFLOP budget compute (approach 2's budgets, with or without a minimum), (P,)."""
    by_id = {i: b["flops"] for b in approach2.get("budgets", []) + approach2.get("budgets_excluded", [])
             for i in b.get("ids", [])}
    return np.array([by_id.get(i, c) for i, c in zip(points.ids, points.flops_P)], float)


def drop_each(points: Points, approach2: dict[str, Any]) -> np.ndarray:
    """(B, P) bool: row b keeps every point but those of approach 2's budget b."""
    flops_P = _budget_flops(points, approach2)
    return np.array([np.abs(flops_P / b["flops"] - 1) > isoflop.BUDGET_RTOL for b in approach2["budgets"]])


def approach3_fits(points: Points, approach3: dict[str, Any], keep_KP: np.ndarray,
                   warm: bool = False) -> list[parametric.LossFit | None]:
    """Approach 3 refitted on each row's points (`keep_KP` (K, P) bool), None where a refit has fewer than 5 points,
    fails, or has no positive E. `warm`: start each refit also from `approach3`'s solution (leave-one-out stability;
    a backtest origin must not, since that solution has seen the later budgets)."""
    keep_KP = np.asarray(keep_KP, bool)
    if approach3.get("E") is None or not len(keep_KP):
        return [None] * len(keep_KP)
    start = parametric.LossFit(**{k: approach3[k] for k in ("E", "A", "B", "alpha", "beta")}, objective=np.nan)
    fits_K = parametric.fit_batch(points.params_P, points.tokens_P, np.broadcast_to(points.loss_P, keep_KP.shape),
                                  keep_KP.astype(float), warm_start=start if warm else None)
    return [f if f is not None and np.isfinite(f.E) and f.E > 0 else None for f in fits_K]


def allocation_of(fit: parametric.LossFit | None) -> dict[str, Any]:
    """A refitted approach 3's allocation {"E", "a", "b", "N_coef", "D_coef"} (N_coef = its N_opt at C = 1), each
    None where the refit failed or has no allocation (α or β ≤ 0)."""
    row: dict[str, Any] = {"E": None, **{k: None for k in allocation.KEYS}}
    if fit is not None:
        row["E"] = float(fit.E)
        if fit.alpha > 0 and fit.beta > 0 and np.isfinite(fit.G) and fit.G > 0:
            row.update(a=float(fit.a), b=float(fit.b), N_coef=float(fit.n_opt(1.0)), D_coef=float(fit.d_opt(1.0)))
    return row


def approach3_e(points: Points, approach3: dict[str, Any], keep_KP: np.ndarray,
                warm: bool = False) -> list[float | None]:
    """Approach 3's E refitted on each row's points (`approach3_fits`), None where a refit fails."""
    return [None if f is None else float(f.E) for f in approach3_fits(points, approach3, keep_KP, warm)]


def backtest_e(points: Points, approach2: dict[str, Any], approach3: dict[str, Any]) -> dict[float, float | None]:
    """For each budget minimum (C_opt), approach 3's E on the points of the budgets up to it alone: the E each
    backtest origin holds (`frontier.fit_frontier`'s `e3_refits`)."""
    budgets = approach2.get("budgets", [])
    flops_P = _budget_flops(points, approach2)
    keep_KP = np.array([flops_P <= b["flops"] * (1 + isoflop.BUDGET_RTOL) for b in budgets]).reshape(-1, len(points))
    return {float(b["C_opt"]): e for b, e in zip(budgets, approach3_e(points, approach3, keep_KP))}


def reference_flops(approach2: dict[str, Any]) -> float:
    """Where the stability is measured without prediction budgets: REFERENCE_FACTOR × the largest budget's C_opt
    (not the largest point's compute, which a digitised grid's jitter can put far beyond its last minimum)."""
    return REFERENCE_FACTOR * max(float(b["C_opt"]) for b in approach2["budgets"])


def leave_one_budget_out(points: Points, approach2: dict[str, Any], approach3: dict[str, Any],
                         front: dict[str, Any], flops_Q: Sequence[float]) -> dict[str, Any] | None:
    """How much the forecast at each of `flops_Q` (none: REFERENCE_FACTOR × the largest budget) moves when any one
    budget is dropped (its minimum from approach 2, its points from approach 3), everything refitted by the same
    rules (`frontier.choose`, `allocation.law`, named `allocation.RULE`): fit.json's frontier "sensitivity". None
    without a frontier or with fewer than 3 minima (dropping one leaves too few)."""
    budgets, law = approach2.get("budgets", []), front.get("law")
    if law is None or len(budgets) < 3:
        return None
    flops_B = np.array([b["C_opt"] for b in budgets])
    loss_B = np.array([b["loss_opt"] for b in budgets])
    asked = [float(c) for c in flops_Q] or [reference_flops(approach2)]
    refit_K = [allocation_of(f) for f in approach3_fits(points, approach3, drop_each(points, approach2), warm=True)]
    e_K = [r["E"] for r in refit_K]
    full_loss = frontier.loss_at(law, np.array(asked))
    n_B, d_B = np.array([b["N_opt"] for b in budgets]), np.array([b["D_opt"] for b in budgets])
    full = allocation.law(approach2, approach3)
    full_n = full["N_coef"] * np.array(asked) ** full["a"] if full is not None else None
    keep_KB = ~np.eye(len(budgets), dtype=bool)
    chosen = frontier.choose_many([(flops_B[keep], loss_B[keep], e) for keep, e in zip(keep_KB, e_K)],
                                  front.get("minima_noise_sd"))
    rows = []
    for b, keep_B, (law_i, choice), refit in zip(budgets, keep_KB, chosen, refit_K):
        row: dict[str, Any] = {"dropped_flops": float(b["flops"]), "E_from": choice["E_from"]}
        row["loss_change"] = (frontier.loss_at(law_i, np.array(asked)) / full_loss - 1).tolist() if law_i else None
        if full_n is not None:
            laws = isoflop.power_laws(flops_B[keep_B, None], n_B[keep_B, None], d_B[keep_B, None])
            alloc = allocation.law({k: float(v[0]) for k, v in laws.items()}, refit)
            row["params_change"] = (alloc["N_coef"] * np.array(asked) ** alloc["a"] / full_n - 1).tolist()
        rows.append(row)
    out: dict[str, Any] = {"method": "each budget dropped in turn (its minimum and its points), the frontier and "
                                     "the allocation (approaches 2 and 3) refitted; change = forecast without it / "
                                     "with all − 1",
                           "allocation_rule": allocation.RULE, "at_flops": asked, "reference": None if flops_Q else
                           f"no prediction budget asked: at {REFERENCE_FACTOR:g}x the largest budget", "dropped": rows}
    for key in ("loss_change", "params_change"):
        changes = [r[key] for r in rows if r.get(key) is not None]
        if changes:
            abs_RQ = np.abs(np.array(changes))
            out[key.replace("change", "max_abs_change")] = abs_RQ.max(axis=0).tolist()
            out[key.replace("change", "mean_abs_change")] = abs_RQ.mean(axis=0).tolist()
    return out
