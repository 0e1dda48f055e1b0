"""Levenberg–Marquardt for K independent small least-squares problems at once, robust (Huber) or plain.

Legend: K = problems, P = residuals of one problem, n = parameters of one problem.

Each problem k minimises Σ_p m_kp·ρ(r_kp(x_k)) over its parameters x_k (n,), inside the box [lower, upper], with ρ
the Huber loss of threshold δ (`delta`; None: ρ(r) = r²/2, plain least squares) and m_kp ∈ {0, 1} a mask (a
residual a problem leaves out: a refit on a subset of the points). The step is a damped Gauss–Newton step on the
iteratively reweighted problem (IRLS: weights ψ(r)/r = min(1, δ/|r|), which majorise the Huber loss), taken
only where it lowers the problem's own objective; its damping λ falls after a success and rises after a failure,
problem by problem. A step that leaves the box is clipped to it (a projected step; still accepted only if it
lowers the objective). The K problems run in one numpy call per iteration, so K refits (noise draws, hold-outs,
starting points) cost about one: scipy's optimizers take one problem per call at ~1 ms of overhead each.

It stops a problem when a step lowers its objective by less than `rtol` (relative), after `patience` failed
steps in a row, or after `max_iter` iterations; callers that need scipy's own stopping rule polish the winner
with it (`parametric.fit_loss`).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

# (x (k, n), the problems' indices (k,)) → r (k, P), J (k, P, n): the residuals of those k of the K problems
Residuals = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def objective(r_KP: np.ndarray, mask_KP: np.ndarray, delta: float | None) -> np.ndarray:
    """Σ_p m·ρ(r) over the last axis (P), per problem (K,) or any leading shape; NaN counts as +inf."""
    if delta is None:
        rho_KP = 0.5 * r_KP**2
    else:
        a_KP = np.abs(r_KP)
        rho_KP = np.where(a_KP <= delta, 0.5 * r_KP**2, delta * (a_KP - 0.5 * delta))
    f_K = (mask_KP * rho_KP).sum(axis=-1)
    return np.where(np.isfinite(f_K), f_K, np.inf)


def minimize(residuals: Residuals, x_Kn: np.ndarray, mask_KP: np.ndarray, *, delta: float | None,
             lower: np.ndarray | None = None, upper: np.ndarray | None = None, max_iter: int = 500,
             rtol: float = 1e-15, patience: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """The K problems' minimisers (K, n) and objectives (K,), from the starts `x_Kn` (module docstring).

    `residuals(x, idx)` gives r (k, P) and its Jacobian (k, P, n) of problems `idx` at their parameters x (k, n);
    `mask_KP` (K, P) or (P,) weighs each residual (0: left out); `lower`/`upper` (n,) or (K, n) bound the parameters
    (None: unbounded; lower = upper holds a parameter fixed). A parameter at a bound that the gradient pushes
    against is held there for the step (an active set), so that the others still move."""
    x_Kn = np.array(x_Kn, float)
    k_count, n = x_Kn.shape
    lower_Kn = np.broadcast_to(np.full(n, -np.inf) if lower is None else np.asarray(lower, float), x_Kn.shape)
    upper_Kn = np.broadcast_to(np.full(n, np.inf) if upper is None else np.asarray(upper, float), x_Kn.shape)
    x_Kn = np.clip(x_Kn, lower_Kn, upper_Kn)
    mask_KP = np.asarray(mask_KP, float)

    def evaluate(x: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with np.errstate(all="ignore"):
            r, j = residuals(x, idx)
        keep = np.broadcast_to(mask_KP, (k_count, r.shape[1]))[idx] > 0  # a left-out residual may be anything
        return np.where(keep, r, 0.0), np.where(keep[..., None], j, 0.0)

    r_KP, j_KPn = evaluate(x_Kn, np.arange(k_count))
    mask_KP = np.broadcast_to(mask_KP, r_KP.shape)
    f_K = objective(r_KP, mask_KP, delta)
    lam_K = np.full(k_count, 1e-3)
    fails_K = np.zeros(k_count, int)
    active_K = np.isfinite(f_K)
    eye = np.eye(n)
    for _ in range(max_iter):
        if not active_K.any():
            break
        idx = np.flatnonzero(active_K)
        r, j, m, x, lo, hi = r_KP[idx], j_KPn[idx], mask_KP[idx], x_Kn[idx], lower_Kn[idx], upper_Kn[idx]
        if delta is None:
            psi, w = r, np.ones_like(r)
        else:
            psi = np.clip(r, -delta, delta)
            w = np.minimum(1.0, delta / np.maximum(np.abs(r), 1e-300))  # ψ(r)/r: the IRLS weights
        psi, w = psi * m, w * m
        g_Kn = (psi[:, None, :] @ j)[:, 0]
        free_Kn = (lo < hi) & ~((x <= lo) & (g_Kn > 0)) & ~((x >= hi) & (g_Kn < 0))
        h_Knn = ((j * w[..., None]).transpose(0, 2, 1) @ j) * free_Kn[:, :, None] * free_Kn[:, None, :]
        scale_K = np.max(np.abs(h_Knn), axis=(1, 2))
        diag_Kn = np.maximum(np.einsum("kii->ki", h_Knn), 1e-12 * scale_K[:, None] + 1e-300)
        diag_Kn = np.where(free_Kn, diag_Kn, 1.0)
        lhs = h_Knn + ((lam_K[idx, None] * free_Kn + ~free_Kn) * diag_Kn)[:, :, None] * eye
        rhs = np.where(free_Kn, g_Kn, 0.0)
        try:
            step_Kn = -np.linalg.solve(lhs, rhs[..., None])[..., 0]
        except np.linalg.LinAlgError:  # a singular system in the batch: least squares one by one
            step_Kn = -np.stack([np.linalg.lstsq(a_, b_, rcond=None)[0] for a_, b_ in zip(lhs, rhs)])
        trial = np.clip(x + step_Kn, lo, hi)
        r_new, j_new = evaluate(trial, idx)
        f_new = objective(r_new, m, delta)
        better = f_new < f_K[idx]
        gain = np.where(better, (f_K[idx] - f_new) / np.maximum(np.abs(f_K[idx]), 1e-300), 0.0)
        ok = idx[better]
        x_Kn[ok], r_KP[ok], j_KPn[ok], f_K[ok] = trial[better], r_new[better], j_new[better], f_new[better]
        lam_K[ok] = np.maximum(lam_K[ok] / 3.0, 1e-9)
        bad = idx[~better]
        lam_K[bad] *= 4.0
        fails_K[ok], fails_K[bad] = 0, fails_K[bad] + 1
        done = (better & (gain < rtol)) | (fails_K[idx] >= patience) | (lam_K[idx] > 1e12)
        active_K[idx[done]] = False
    return x_Kn, f_K
