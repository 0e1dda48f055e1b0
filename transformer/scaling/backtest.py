"""Backtests (refit on the data up to an origin, predict beyond it) and the prediction intervals calibrated on them.

Legend: B = budget minima (increasing compute), J = backtest pairs, K = noise draws.

Backtest (`pairs`): for every k ≥ MIN_BUDGETS that leaves a later budget, the frontier is refitted (the same rule
as the fit: `frontier.choose`) on the first k budget minima and predicts the optimal loss of each later budget j.
Each pair records e = ln(L̂_j / L_j) and the distance x = ln(C_j / C_k) beyond the largest budget the refit saw;
fit.json and the console show them, with their RMS per e-fold (`misfit_scale`, `summary`).

The frontier's interval (`frontier_interval`): L̂·exp(±h), h = max(Z·σ_noise, q·x·γ^a/span^p), σ_noise the sd of
ln L̂ over the loss-noise draws (at C inside the fitted range, at the largest fitted budget beyond it),
x = ln(C / C_largest fitted), γ the frontier's exponent (at least GAMMA_FLOOR), a = GAMMA_POWER, span =
ln(C_largest / C_smallest) of the fitted minima, p = SPAN_POWER: the extrapolation term grows with the distance and
with how steeply the law says the loss still falls, and shrinks, less than in proportion, with the compute range the
data cover. q =
FRONTIER_SPREAD is one constant, calibrated on the leave-future-out pairs of published IsoFLOP sets
(`experiments.reproduce_frontier`: the split-conformal 95% quantile of the score each pair needs,
`conformal_multiplier` with each set weighted equally; `leave_group_out` measures the coverage on a data source q
was not calibrated on). A set's own backtest is not used for the width: on the published pairs, the RMS per e-fold
of a set's earlier refits predicts its next error worse than one constant does (docs/fitting.md).

The loss at any (N, D) has its own backtests and interval (`point_backtests`, `point_interval`).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
from scipy import special  # ndtri: the normal quantile (scipy.stats costs ~0.5 s to import)

from transformer.scaling.interval import NO_NOISE, Interval, none

MIN_BUDGETS = 3  # a frontier refit needs 3 minima (E, k, γ)
COVERAGE = 0.95  # the intervals are 95% ones
Z95 = (1 + COVERAGE) / 2
# The prior of the misfit scale: 2 pseudo-refits at 0.5% per e-fold (the median backtest misfit of Porian et al.'s
# tuned settings), so that a set with one or no backtest refit still reports a finite scale.
PRIOR_ORIGINS = 2
PRIOR_PER_EFOLD = 0.005
# How the two terms of an interval combine (`combine`): in quadrature, or the larger of them.
QUADRATURE, LARGER = "quadrature", "larger"
# The frontier's interval (`frontier_interval`): h = max(Z·σ_noise, q·x·γ^a/span^p), the noise term a floor inside the fitted
# range. On the published leave-future-out pairs its noise draws do not predict its errors (an interval of q·Z·σ_noise
# alone needs q = 29.5 for 95%, and most pairs fall inside Z·σ_noise), so adding it in quadrature to the extrapolation
# term widened every interval for no coverage: out of sample the larger of the two gives the same coverage (95%)
# at median widths 8% narrower below 4x and at ≥4x (docs/fitting.md, "Why the larger term").
FRONTIER_COMBINE = LARGER
# Where the noise term is taken beyond the data: at the largest fitted budget, where the data end, not at the asked C.
# The draws' spread at C is the noise's effect on the extrapolation, which the calibrated term already covers (its
# scores are real errors, noise included); on the published pairs it set the width of 35 of 783 pairs at ≥ 4x (the
# far extrapolations through 2–3 minima, whose free-E draws run wide) and of none once taken at the edge: out of
# sample the same coverage (95% below 4x, at ≥ 4x, at 4–16x) at a median width 8% narrower at ≥ 4x (19.0% → 17.5%)
# (docs/fitting.md, "The noise term beyond the data").
NOISE_AT = "the asked budget inside the fitted range, the largest fitted budget beyond it"
# p, the power of the span in the lever x·γ^a/span^p: on the published pairs a fit over a wider compute range (more
# minima) extrapolates better, but less than in proportion to its span. With p = 1 and no γ (until 2026-11-27) pairs
# refitted on 2–3 minima were covered 99.5% and those on ≥ 6 minima 88%; with 0.75, 95% and 92.5%. With γ^a in the
# lever, (p, a) chosen among p 0.5–1 and a 0–0.75 on the other sources' pairs: (0.625, 0.5) for 17 of 18 sources.
SPAN_POWER = 0.625
# a, the power of the frontier's γ in the lever: an extrapolation's error grows with how steeply the fitted law says the
# loss still falls (the reducible loss falls γ·x e-folds over x). On the published pairs the median |error| at ≥ 4x is
# 0.8% where the refit's γ < 0.15 and 11% where γ > 0.5; x/span^0.75 alone covered the pairs in the lowest third of γ
# 100% and those in the highest 90% at ≥ 4x. With √γ, out of sample: half-width / median |error| 3.48 → 2.96 at ≥ 4x,
# 3.53 → 2.96 at 4–16x, 2.93 → 2.46 below 4x, each covered ≥ 94% (docs/fitting.md, "Why γ in the lever").
GAMMA_POWER = 0.5
# γ below this counts as this: the published refits' γ reach down to 0.053; a flatter law has no calibration data, and an
# interval that shrank to nothing with γ → 0 would trust a flat misfit most.
GAMMA_FLOOR = 0.05
# q is the split-conformal 95% quantile of the hold-out score (`needed_spread`: 0 where |e| ≤ Z·σ_noise, else
# |e| / lever) over the leave-future-out pairs of the published IsoFLOP sets (each set weighted equally;
# experiments.reproduce_frontier), rounded up; each source's q calibrated on the other sources alone covers its
# pairs out of sample (docs/fitting.md).
FRONTIER_SPREAD = 0.077  # 0.0763 (x/span^0.75: 0.0520, shipped 0.052; x/span: 0.0659; in quadrature 0.0618)
SPREAD_FROM = ("95% quantile of |error| / lever over the leave-future-out pairs of 21 published IsoFLOP sets "
               "(Porian et al. 2024's 15 settings, Chinchilla (Epoch AI's extraction), Open-Athena's ml_scalefit, "
               "epochai_chinchilla, misfitting and Llama 3 raw/exp); docs/fitting.md")
Z = float(special.ndtri(Z95))  # 1.96: the noise term's 95% normal quantile


def pairs(flops_B: Sequence[float], loss_B: Sequence[float],
          fit_fn: Callable[[np.ndarray, np.ndarray], dict[str, float] | None],
          loss_fn: Callable[[dict[str, float], float], float]) -> list[dict[str, float]]:
    """Refit on the first k minima (k = MIN_BUDGETS … B−1) and predict each later one: a list of
    {"k", "fit_flops" (C_k), "flops" (C_j), "distance" x, "predicted", "measured", "log_error" e}."""
    order_B = np.argsort(np.asarray(flops_B, float), kind="stable")
    flops_B, loss_B = np.asarray(flops_B, float)[order_B], np.asarray(loss_B, float)[order_B]
    out = []
    for k in range(MIN_BUDGETS, len(flops_B)):
        law = fit_fn(flops_B[:k], loss_B[:k])
        if law is None:
            continue
        for j in range(k, len(flops_B)):
            predicted = float(loss_fn(law, flops_B[j]))
            out.append({"k": k, "fit_flops": float(flops_B[k - 1]), "flops": float(flops_B[j]),
                        "distance": float(np.log(flops_B[j] / flops_B[k - 1])), "predicted": predicted,
                        "measured": float(loss_B[j]), "log_error": float(np.log(predicted / loss_B[j]))})
    return out


def misfit_scale(bt_J: list[dict[str, float]], min_origin: int = MIN_BUDGETS) -> dict[str, Any]:
    """{"per_efold" s, "backtest_per_efold", "origins", "pairs", "min_origin"}: the RMS of e/x over the pairs with
    x > 0 whose refit saw at least `min_origin` budgets, pooled with a prior of PRIOR_ORIGINS pseudo-refits at
    PRIOR_PER_EFOLD (s² = (n₀·s₀² + n·s_bt²) / (n₀ + n), n the refits). A description of the set's backtest for
    fit.json and the console; the interval does not use it (module docstring)."""
    usable = [p for p in bt_J if p["distance"] > 0 and p["k"] >= min_origin]
    origins = len({p["k"] for p in usable})
    s_bt = float(np.sqrt(np.mean([(p["log_error"] / p["distance"]) ** 2 for p in usable]))) if usable else None
    s2 = (PRIOR_ORIGINS * PRIOR_PER_EFOLD**2 + origins * (s_bt or 0.0) ** 2) / (PRIOR_ORIGINS + origins)
    return {"per_efold": float(np.sqrt(s2)), "backtest_per_efold": s_bt, "origins": origins, "pairs": len(usable),
            "min_origin": min_origin}


def summary(bt_J: list[dict[str, float]], min_origin: int = MIN_BUDGETS) -> dict[str, Any]:
    """The backtest as fit.json stores it: the pairs, the misfit scale (`misfit_scale`), and |e| (median, max)."""
    scale = misfit_scale(bt_J, min_origin)
    out: dict[str, Any] = {"method": "refit on the first k budget minima (k ≥ 3), predict each later one; "
                                     "log_error = ln(predicted / measured), distance = ln(C_j / C_k)",
                           "pairs": bt_J, **{f"misfit_{k}": v for k, v in scale.items()}}
    if bt_J:
        e_J = np.abs([p["log_error"] for p in bt_J])
        out["median_abs_error"] = float(np.median(e_J))
        out["max_abs_error"] = float(np.max(e_J))
    return out


def lever_gamma(gamma: float | None) -> float | None:
    """The γ the lever uses: the law's, at least GAMMA_FLOOR (None: none)."""
    return None if gamma is None else max(float(gamma), GAMMA_FLOOR)


def lever(distance: float, span: float, gamma: float | None = None, span_power: float = SPAN_POWER,
          gamma_power: float = GAMMA_POWER) -> float:
    """The frontier's extrapolation lever x·γ^a / span^p: x = ln(C / C_largest fitted) (0 inside the fitted range),
    γ = `gamma` the frontier's exponent (at least GAMMA_FLOOR; None: no such factor, as in the allocation's comparison
    forms), span = ln(C_largest / C_smallest) of the fitted minima, p = `span_power`, a = `gamma_power`: how far
    beyond the data, how steeply the law falls there, against the compute range the data cover."""
    steep = 1.0 if gamma is None else lever_gamma(gamma) ** gamma_power
    return max(float(distance), 0.0) * steep / float(span) ** span_power


def combine(fixed_half: float, extra_half: float, how: str = QUADRATURE) -> float:
    """The half-width of two terms: in quadrature, sqrt(fixed² + extra²) (the allocation's: on its published pairs the
    larger gave the same widths), or the larger, max(fixed, extra) (the frontier's, FRONTIER_COMBINE: its noise term
    does not predict its hold-out errors)."""
    _check_how(how)
    return float(np.hypot(fixed_half, extra_half) if how == QUADRATURE else max(fixed_half, extra_half))


def _check_how(how: str) -> None:
    if how not in (QUADRATURE, LARGER):
        raise ValueError(f"combine: how={how!r}; valid: {QUADRATURE!r}, {LARGER!r}")


def log_interval(value: float, noise_sd: float | None, source: str, extra_half: float,
                 extra: str = "extrapolation", how: str = QUADRATURE) -> tuple[Interval, float, str, float, float]:
    """The one mechanism of the intervals calibrated on published hold-outs: value·exp(±h), h = `combine` of Z·σ_noise
    and extra_half (`how`), σ_noise the sd of the log over the noise draws (`source`; None or 0: no noise term,
    "none") and `extra_half` the calibrated term (the frontier's extrapolation, the allocation's scatter, named
    `extra` in the note). Returns (the interval, σ_noise, its source, Z·σ_noise, h): no finite interval where h runs
    away, none where h is 0."""
    noise_sd = float(noise_sd) if noise_sd is not None and np.isfinite(noise_sd) and noise_sd > 0 else 0.0
    source = source if noise_sd > 0 else "none"
    noise_half = Z * noise_sd
    half = combine(noise_half, extra_half, how)
    with np.errstate(over="ignore"):
        bounds = [float(value * np.exp(-half)), float(value * np.exp(half))]
    if not (np.isfinite(half) and np.all(np.isfinite(bounds))):
        ci = Interval(None, None, source, 1.0, f"the {extra} term runs away: no finite interval")
    elif half <= 0:
        ci = none(f"{NO_NOISE}, and no {extra} term: no interval")
    else:
        ci = Interval(*bounds, source, 1.0, None if source != "none" else
                      f"{NO_NOISE}: the {extra} term alone, no noise term")
    return ci, noise_sd, source, noise_half, half


def needed_spread(error: float, fixed_half: float, lever: float, how: str = QUADRATURE) -> float:
    """The hold-out score the calibrations take the conformal quantile of: the least q for which the interval
    `combine`(fixed_half, q·lever, how) covers the log error `error` (`fixed_half`: the terms not calibrated):
    sqrt(max(e² − fixed_half², 0)) / lever in quadrature; 0 where |e| ≤ fixed_half, else |e| / lever, for the larger."""
    _check_how(how)
    if how == LARGER:
        return 0.0 if abs(error) <= fixed_half else float(abs(error) / lever)
    return float(np.sqrt(max(error**2 - fixed_half**2, 0.0)) / lever)


def frontier_interval(loss: float, distance: float, span: float, noise_sd: float | None, source: str,
                      spread: float | None = None, noise_flops: float | None = None,
                      gamma: float | None = None) -> tuple[Interval, dict[str, Any]]:
    """The 95% interval of the frontier's predicted loss `loss` at `distance` = ln(C / C_largest fitted):
    L̂·exp(±h), h = max(Z·σ_noise, q·x·γ^a/span^p) (`log_interval`, FRONTIER_COMBINE), σ_noise the sd of ln L̂ over the
    noise draws at `noise_flops` (the asked C inside the fitted range, the largest fitted budget beyond it: NOISE_AT;
    `source`; None or 0: no noise term, "none"), x·γ^a/span^p = `lever(distance, span, gamma)` (`gamma`: the law's
    exponent), q = `spread` (None:
    FRONTIER_SPREAD, calibrated on the published hold-outs). Returns it and its terms, fit.json's `loss_interval`:
    what drives the width (each term's half-width in ln L), the inputs, and where the constant came from."""
    spread = FRONTIER_SPREAD if spread is None else float(spread)
    lev = lever(distance, span, gamma)
    extrap_half = spread * lev
    ci, noise_sd, source, noise_half, half = log_interval(loss, noise_sd, source, extrap_half, how=FRONTIER_COMBINE)
    if not ci.exists and half <= 0:
        ci = none(f"{NO_NOISE}, and the prediction is inside the fitted range: no interval")
    terms = {"method": f"ln L ± max(1.96·σ_noise, q·x·γ^{GAMMA_POWER:g}/span^{SPAN_POWER:g})",
             "half_width_log": half if ci.exists else None,
             "noise_half_width_log": noise_half, "extrapolation_half_width_log": extrap_half,
             "noise_sd_log": noise_sd, "noise_at_flops": noise_flops, "source": source,
             "distance": max(float(distance), 0.0), "span": float(span), "span_power": SPAN_POWER,
             "gamma": lever_gamma(gamma), "gamma_power": GAMMA_POWER,
             "lever": lev, "spread": spread, "spread_from": SPREAD_FROM, "calibrated": ci.exists}
    return ci, terms


def log_sd(values_K: np.ndarray) -> float | None:
    """The sd of ln v over the finite positive draws (None with fewer than 2): a robust one (IQR/1.349), so
    that a few runaway draws do not set it."""
    v = np.asarray(values_K, float)
    v = v[np.isfinite(v) & (v > 0)]
    if len(v) < 2:
        return None
    q25, q75 = np.percentile(np.log(v), [25, 75])
    return float((q75 - q25) / 1.349)


def median_log_sd(values_BK: np.ndarray | None) -> float | None:
    """The noise of one minimum: the median over rows (budgets) of `log_sd` over the columns (noise draws) of
    `values_BK` (B, K): of ln L_opt for the frontier, of ln N_opt or ln D_opt for the allocation. None without draws."""
    if values_BK is None:
        return None
    sd_B = [v for row in np.asarray(values_BK, float) if (v := log_sd(row)) is not None]
    return float(np.median(sd_B)) if sd_B else None


def conformal_multiplier(scores: Sequence[float], level: float = COVERAGE,
                         weights: Sequence[float] | None = None) -> float:
    """The split-conformal quantile of `scores` (one per hold-out): the ⌈(n + 1)·level⌉-th smallest, so that a new
    exchangeable hold-out's score falls below it with probability ≥ `level`; inf when n is too few for `level`
    (n + 1 < 1 / (1 − level)). With `weights` (e.g. 1 / the hold-outs of its data set, so that each set counts
    once): the smallest score whose cumulative weight reaches level·(W + w_max), W the total weight and w_max the
    largest one standing in for the new hold-out's (equal weights give the unweighted rule)."""
    s_N = np.asarray(scores, float)
    if s_N.size == 0 or not np.all(np.isfinite(s_N)):
        raise ValueError(f"conformal_multiplier needs finite scores, got {list(scores)}")
    w_N = np.ones(s_N.size) if weights is None else np.asarray(weights, float)
    order = np.argsort(s_N, kind="stable")
    reach = np.cumsum(w_N[order]) >= level * (w_N.sum() + w_N.max()) * (1 - 1e-12)
    return float(s_N[order][np.argmax(reach)]) if reach.any() else float("inf")


def leave_group_out(scores: Sequence[float], groups: Sequence[str], level: float = COVERAGE,
                    weights: Sequence[float] | None = None) -> list[float]:
    """For each hold-out, the multiplier calibrated (`conformal_multiplier`, with `weights` where given) on the
    hold-outs of every other group (a data source: its near-duplicate extractions together): covered out of sample
    where score ≤ it."""
    s_N, g_N = np.asarray(scores, float), np.asarray(groups)
    w_N = np.ones(s_N.size) if weights is None else np.asarray(weights, float)
    by_group = {g: conformal_multiplier(s_N[g_N != g], level, w_N[g_N != g]) for g in dict.fromkeys(g_N)}
    return [by_group[g] for g in g_N]
