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
from transformer.spec import ConfigError
from transformer.scaling import batch_lm

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
    return fit_many(n_P, d_P, l_P, np.ones((1, len(l_P)), bool))[0]


def fit_many(params_P: np.ndarray, tokens_P: np.ndarray, loss_P: np.ndarray,
             mask_KP: np.ndarray) -> list[dict[str, float]]:
    """`fit` of K subsets of the points at once (refits on the smaller sizes: row k of the mask `mask_KP` (K, P) marks
    its points, at least 4 each): one Levenberg–Marquardt batch (`batch_lm`) over the K subsets × the starts."""
    n_P, d_P, l_P = (np.asarray(v, float) for v in (params_P, tokens_P, loss_P))
    mask_KP = np.asarray(mask_KP, bool)
    log_c_P, log_m_P, log_l_P = np.log(6 * n_P * d_P), np.log(d_P / n_P), np.log(l_P)
    count_K = mask_KP.sum(axis=1)
    centre_K = (mask_KP * log_c_P).sum(axis=1) / count_K  # a, b at the centre keep the fit well scaled
    masked_l_KP = np.where(mask_KP, l_P, np.nan)
    min_K, median_K = np.nanmin(masked_l_KP, axis=1), np.nanmedian(masked_l_KP, axis=1)
    med_m_K = np.nanmedian(np.where(mask_KP, log_m_P, np.nan), axis=1)
    upper_K = np.log(min_K) - 1e-9
    starts, owner = [], []
    for fraction in E_STARTS:
        for eta0 in ETA_STARTS:
            gap_K = np.maximum(median_K * (1 - fraction), 1e-6)
            starts.append(np.stack([np.log(gap_K / 2) - eta0 * med_m_K, np.log(gap_K / 2) + eta0 * med_m_K,
                                    np.full(len(min_K), eta0), np.log(fraction * min_K)], axis=1))
            owner.append(np.arange(len(min_K)))
    owner_S = np.concatenate(owner)
    lower_S4 = np.stack([np.full(len(owner_S), -np.inf)] * 2 + [np.zeros(len(owner_S)), np.full(len(owner_S), -np.inf)], 1)
    upper_S4 = np.stack([np.full(len(owner_S), np.inf)] * 2 + [np.full(len(owner_S), 2.0), upper_K[owner_S]], 1)
    x_S4 = np.minimum(np.concatenate(starts), upper_S4 - np.array([0, 0, 0, 1e-9]))

    def residuals(p_S4: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ln_a, ln_b, eta, ln_e = (p_S4[:, i : i + 1] for i in range(4))
        c_SP = -eta * (log_c_P - centre_K[owner_S[idx], None])
        terms_3SP = np.stack([np.broadcast_to(ln_e, c_SP.shape), ln_a + eta * log_m_P + c_SP, ln_b - eta * log_m_P + c_SP])
        total_SP = np.logaddexp.reduce(terms_3SP, axis=0)
        w_3SP = np.exp(terms_3SP - total_SP)
        d_eta = w_3SP[1] * log_m_P - w_3SP[2] * log_m_P - (w_3SP[1] + w_3SP[2]) * (log_c_P - centre_K[owner_S[idx], None])
        return total_SP - log_l_P, np.stack([w_3SP[1], w_3SP[2], d_eta, w_3SP[0]], axis=-1)

    x_S4, f_S = batch_lm.minimize(residuals, x_S4, mask_KP[owner_S], delta=None, lower=lower_S4, upper=upper_S4)
    out = []
    for k in range(len(min_K)):
        mine = np.flatnonzero(owner_S == k)
        s = mine[int(np.argmin(f_S[mine]))]
        ln_a, ln_b, eta, ln_e = x_S4[s]
        shift = eta * centre_K[k]  # a·C^-η with C in its own units: a = exp(ln a_c + η·centre)
        with np.errstate(over="ignore"):
            out.append({"E": float(np.exp(ln_e)), "a": float(np.exp(ln_a + shift)), "b": float(np.exp(ln_b + shift)),
                        "eta": float(eta), "rms_log_residual": float(np.sqrt(2 * f_S[s] / count_K[k]))})
    return out


def loss_at(law: dict[str, Any], params: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """L at (N, D) under the fitted form, broadcasting N and D."""
    n, d = np.asarray(params, float), np.asarray(tokens, float)
    m, c = d / n, 6 * n * d
    with np.errstate(over="ignore"):
        return law["E"] + (law["a"] * m ** law["eta"] + law["b"] * m ** -law["eta"]) * c ** -law["eta"]
