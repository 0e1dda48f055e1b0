"""The loss frontier L_opt(C) = E + k·C^(−γ) through the per-budget minima, and predictions at any C.

Legend: B = budgets, K = noise draws, Q = budgets asked for.

The irreducible term E stays in the model: a pure power law through the minima bends the wrong way and
misses the loss at 4× the largest budget by 2–3% (docs, scaling-design notes). The fit is least squares
in ln L (ln L = logaddexp(ln k − γ ln C, ln E)) with 0 < E < min L_opt and γ ≥ 0, from a few starts.

Which minima set E: the largest FRONTIER_BUDGETS (`fit_largest`). Fitted through every minimum, the smallest
budgets (where the loss still falls steeply and the form bends most) pull E up, and the frontier over-predicts
far out: on the published IsoFLOP sets (docs/fitting.md) the largest six give a median |error| of 0.16% at 2×
and 0.40% at 4× the largest fitted budget, against 0.76% and 1.85% through every minimum (weighting the
largest budgets, or a pure power law through the last three, fall between).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from scipy import optimize

from transformer.scaling import backtest

E_STARTS = (0.2, 0.5, 0.8, 0.95)  # E as fractions of the lowest minimum


FRONTIER_BUDGETS = 6  # the frontier is fitted to the minima of the largest this many budgets
E_UNIDENTIFIED = 1e-3  # a fitted E below this fraction of the lowest minimum: the minima do not pin E down


def fit(flops_B: np.ndarray, loss_B: np.ndarray, e_fixed: float | None = None) -> dict[str, float] | None:
    """{"E", "k", "gamma", "rms_log_residual"} or None with fewer than 3 budgets (2 with `e_fixed`) or a
    failed fit. `e_fixed`: E held at that value (only k and γ fitted)."""
    flops_B, loss_B = np.asarray(flops_B, float), np.asarray(loss_B, float)
    if len(flops_B) < (2 if e_fixed else 3) or not np.all(np.isfinite(loss_B) & (loss_B > 0)):
        return None
    if e_fixed is not None and not 0 < e_fixed < loss_B.min():
        return None
    log_c_B, log_l_B = np.log(flops_B), np.log(loss_B)
    centre = float(np.mean(log_c_B))  # k at the centre keeps the fit well scaled: k·C^-γ = exp(ln k_c − γ(ln C − centre))
    upper = float(np.log(loss_B.min())) - 1e-9

    def residual(p: np.ndarray) -> np.ndarray:
        ln_kc, gamma, ln_e = p if e_fixed is None else (*p, np.log(e_fixed))
        return np.logaddexp(ln_kc - gamma * (log_c_B - centre), ln_e) - log_l_B

    best = None
    for fraction in E_STARTS if e_fixed is None else (e_fixed / loss_B.min(),):
        e0 = fraction * loss_B.min()
        gap_B = np.log(np.maximum(loss_B - e0, 1e-12))
        slope, level = np.polyfit(log_c_B - centre, gap_B, 1)
        x0 = np.array([level, max(-slope, 1e-3), np.log(e0)])
        lower_b, upper_b = [-np.inf, 0.0, -np.inf], [np.inf, 10.0, upper]
        if e_fixed is not None:
            x0, lower_b, upper_b = x0[:2], lower_b[:2], upper_b[:2]
        try:
            res = optimize.least_squares(residual, np.clip(x0, np.array(lower_b) + 1e-9, np.array(upper_b) - 1e-9),
                                         bounds=(lower_b, upper_b))
        except ValueError:
            continue
        if res.success and (best is None or res.cost < best.cost):
            best = res
    if best is None:
        return None
    ln_kc, gamma, ln_e = best.x if e_fixed is None else (*best.x, np.log(e_fixed))
    k = float(np.exp(ln_kc + gamma * centre))
    if not np.isfinite(k):
        return None
    return {"E": float(np.exp(ln_e)), "k": k, "gamma": float(gamma),
            "rms_log_residual": float(np.sqrt(np.mean(best.fun**2)))}


def largest(flops_B: Sequence[float], loss_B: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """The FRONTIER_BUDGETS largest-compute minima, increasing in C: (flops, loss), each (≤ FRONTIER_BUDGETS,)."""
    order_B = np.argsort(np.asarray(flops_B, float), kind="stable")[-FRONTIER_BUDGETS:]
    return np.asarray(flops_B, float)[order_B], np.asarray(loss_B, float)[order_B]


def fit_largest(flops_B: Sequence[float], loss_B: Sequence[float], e_fixed: float | None = None) -> dict[str, float] | None:
    """`fit` through the largest FRONTIER_BUDGETS minima (see the module docstring)."""
    return fit(*largest(flops_B, loss_B), e_fixed=e_fixed)


def loss_at(law: dict[str, float], flops: np.ndarray) -> np.ndarray:
    """L_opt(C) = E + k·C^(−γ)."""
    return law["E"] + law["k"] * np.power(np.asarray(flops, float), -law["gamma"])


def _ci(values: np.ndarray) -> list[float] | None:
    values = values[np.isfinite(values)]
    return [float(v) for v in np.percentile(values, [2.5, 97.5])] if len(values) >= 2 else None


def predictions(
    flops_Q: Sequence[float], approach2: dict[str, Any], law: dict[str, float] | None,
    draws: dict[str, np.ndarray] | None, calibration: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One object per budget asked for: flops, params (N_opt), tokens (D_opt), loss (L_opt) and their
    95% intervals (`draws`: a, b, N_coef, D_coef and E, k, gamma, each (K,)). The loss interval is
    `backtest.interval`'s: the noise draws' spread widened by the backtest's misfit at the distance beyond the
    largest fitted budget (`calibration`: {"largest_flops", "scale"}); the noise-only one is `loss_noise_ci95`."""
    out = []
    for c in flops_Q:
        pred: dict[str, Any] = {"flops": float(c)}
        if approach2.get("a") is not None:
            pred["params"] = float(approach2["N_coef"] * c ** approach2["a"])
            pred["tokens"] = float(approach2["D_coef"] * c ** approach2["b"])
        pred["loss"] = float(loss_at(law, c)) if law else None
        if approach2.get("a") is None or not law:
            pred["note"] = ("approach 2 has no power law; " if approach2.get("a") is None else "") + \
                ("no frontier (fewer than 3 budget minima)" if not law else "")
        loss_K = None
        if draws is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                pred["params_ci95"] = _ci(draws["N_coef"] * c ** draws["a"])
                pred["tokens_ci95"] = _ci(draws["D_coef"] * c ** draws["b"])
                if law:
                    loss_K = draws["E"] + draws["k"] * c ** -draws["gamma"]
                    pred["loss_noise_ci95"] = _ci(loss_K[loss_K > 0])
        if law and calibration is not None:
            cal = backtest.interval(pred["loss"], float(np.log(c / calibration["largest_flops"])),
                                    backtest.log_sd(loss_K) if loss_K is not None else None, calibration["scale"])
            pred["loss_ci95"] = cal.pop("loss_ci95")
            pred["loss_interval"] = cal
        elif law:
            pred["loss_ci95"] = pred.get("loss_noise_ci95")
        out.append(pred)
    return out
