"""Gadre et al. 2024's over-training form of the loss at (N, D): L(C, M) = E + (a·M^η + b·M^−η)·C^−η, with
C = 6·N·D the compute and M = D/N the tokens per parameter.

Legend: P = points, S = starting points.

It is approach 3's L(N, D) = E + A/N^α + B/D^β with α = β = 2η (A = a·6^−η, B = b·6^−η): four parameters instead
of five, one exponent shared by N and D, which is what lets Gadre et al. extrapolate a family of small models
trained far past compute-optimal (large M) to larger ones. The fit is least squares in ln L,
ln L = logaddexp(ln E, ln a + η ln M − η ln C, ln b − η ln M − η ln C), from a few starts (E as fractions of the
lowest loss), with 0 < E < min L and 0 ≤ η ≤ 2. `at_points` fits it beside approach 3 and uses whichever predicts
better on its backtest by model size.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from scipy import optimize

from transformer.spec import ConfigError

FORM = "L(C, M) = E + (a·M^eta + b·M^-eta)·C^-eta, C = 6ND, M = D/N (Gadre et al. 2024)"
E_STARTS = (0.3, 0.6, 0.9)  # E as fractions of the lowest loss
ETA_STARTS = (0.1, 0.3)


def fit(params_P: np.ndarray, tokens_P: np.ndarray, loss_P: np.ndarray) -> dict[str, float]:
    """{"E", "a", "b", "eta", "rms_log_residual"} fitted to the points (at least 4, all finite and positive)."""
    n_P, d_P, l_P = (np.asarray(v, float) for v in (params_P, tokens_P, loss_P))
    if len(l_P) < 4:
        raise ConfigError(f"the over-training form needs at least 4 points to fit 4 parameters, got {len(l_P)}")
    if not all(np.all(np.isfinite(v) & (v > 0)) for v in (n_P, d_P, l_P)):
        raise ConfigError("the over-training form needs finite positive params, tokens and losses")
    log_c_P, log_m_P, log_l_P = np.log(6 * n_P * d_P), np.log(d_P / n_P), np.log(l_P)
    centre = float(np.mean(log_c_P))  # a, b at the centre keep the fit well scaled
    upper = float(np.log(l_P.min())) - 1e-9

    def residual(p: np.ndarray) -> np.ndarray:
        ln_a, ln_b, eta, ln_e = p
        c = -eta * (log_c_P - centre)
        return np.logaddexp.reduce([np.full_like(c, ln_e), ln_a + eta * log_m_P + c, ln_b - eta * log_m_P + c],
                                   axis=0) - log_l_P

    best = None
    for fraction in E_STARTS:
        for eta0 in ETA_STARTS:
            gap = max(float(np.median(l_P)) * (1 - fraction), 1e-6)
            x0 = np.array([np.log(gap / 2) - eta0 * np.median(log_m_P), np.log(gap / 2) + eta0 * np.median(log_m_P),
                           eta0, np.log(fraction * l_P.min())])
            res = optimize.least_squares(residual, np.minimum(x0, [np.inf, np.inf, 2.0, upper - 1e-9]),
                                         bounds=([-np.inf, -np.inf, 0.0, -np.inf], [np.inf, np.inf, 2.0, upper]))
            if np.all(np.isfinite(res.x)) and (best is None or res.cost < best.cost):
                best = res
    ln_a, ln_b, eta, ln_e = best.x
    shift = eta * centre  # a·C^-η with C in its own units: a = exp(ln a_c + η·centre)
    return {"E": float(np.exp(ln_e)), "a": float(np.exp(ln_a + shift)), "b": float(np.exp(ln_b + shift)),
            "eta": float(eta), "rms_log_residual": float(np.sqrt(np.mean(best.fun**2)))}


def loss_at(law: dict[str, Any], params: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """L at (N, D) under the fitted form, broadcasting N and D."""
    n, d = np.asarray(params, float), np.asarray(tokens, float)
    m, c = d / n, 6 * n * d
    with np.errstate(over="ignore"):
        return law["E"] + (law["a"] * m ** law["eta"] + law["b"] * m ** -law["eta"]) * c ** -law["eta"]
