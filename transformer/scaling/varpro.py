"""Variable projection for L(N, D) = E + A/N^α + B/D^β: for fixed (α, β) the loss is linear in (E, A, B), which
non-negative least squares gives exactly; a grid over (α, β) then maps the whole objective landscape.

Legend: K = problems (one fit, noise draws, hold-out refits), P = points, I = α grid values, J = β grid values,
3 = the linear coefficients (E, A, B).

N and D enter centred, u = ln N − mean ln N and v = ln D − mean ln D (the features exp(−α·u) stay within a few
orders of magnitude for any α on the grid, so the 3×3 normal equations keep their precision); A and B are
returned in the original units (A = A_c·exp(α·mean ln N)).

The inner problem is NNLS on the relative residuals, min over E, A, B ≥ 0 of Σ_p m_kp·((L̂_p − L_p)/L_p)²: the
first-order expansion of the squared log residual ln(L̂/L), solved exactly by enumerating the 7 supports of the 3
coefficients (the NNLS solution is the best of the supports whose unconstrained least-squares solution is
non-negative). It is exact for a squared loss on relative residuals only: the fit's objective (Huber on ln L̂ −
ln L, `parametric`) is minimised afterwards from the grid's best cells by a local refinement of all five
parameters (`parametric.fit_loss`, `parametric.fit_batch`).
"""
from __future__ import annotations

import numpy as np

ALPHA_GRID = np.round(np.arange(0.0, 3.0001, 0.025), 6)  # α (and β) values of the profile grid: 121 each
COARSE_GRID = np.round(np.arange(0.0, 3.0001, 0.1), 6)  # for many problems at once (noise draws, hold-outs)
_SUPPORTS = ((0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2))
_SINGULAR = 1e-10  # a support whose scaled normal matrix has a determinant below this is skipped (collinear)


def centre(log_n_P: np.ndarray, log_d_P: np.ndarray, mask_KP: np.ndarray | None = None) -> tuple[float, float]:
    """The centres of ln N and ln D (the means over the points any problem uses)."""
    used = np.ones(len(log_n_P), bool) if mask_KP is None else np.asarray(mask_KP).any(axis=0)
    return float(np.mean(log_n_P[used])), float(np.mean(log_d_P[used]))


def profile(u_P: np.ndarray, v_P: np.ndarray, loss_KP: np.ndarray, mask_KP: np.ndarray,
            alpha_I: np.ndarray, beta_J: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For every problem k and grid cell (α_i, β_j): the NNLS coefficients (E, A_c, B_c) (K, I, J, 3) and the
    weighted squared relative residual at them (K, I, J); `mask_KP` (K, P) selects each problem's points."""
    w_KP = mask_KP / loss_KP**2  # weights of the normal equations; targets are 1 (relative residuals)
    q_KP = mask_KP / loss_KP
    x_IP = np.exp(-np.outer(alpha_I, u_P))
    y_JP = np.exp(-np.outer(beta_J, v_P))
    k, i, j = len(loss_KP), len(alpha_I), len(beta_J)
    g = np.empty((k, i, j, 3, 3))
    g[..., 0, 0] = w_KP.sum(axis=1)[:, None, None]
    g[..., 0, 1] = g[..., 1, 0] = (w_KP @ x_IP.T)[:, :, None]
    g[..., 0, 2] = g[..., 2, 0] = (w_KP @ y_JP.T)[:, None, :]
    g[..., 1, 1] = (w_KP @ (x_IP**2).T)[:, :, None]
    g[..., 2, 2] = (w_KP @ (y_JP**2).T)[:, None, :]
    g[..., 1, 2] = g[..., 2, 1] = np.einsum("kp,ip,jp->kij", w_KP, x_IP, y_JP, optimize=True)
    rhs = np.empty((k, i, j, 3))
    rhs[..., 0] = q_KP.sum(axis=1)[:, None, None]
    rhs[..., 1] = (q_KP @ x_IP.T)[:, :, None]
    rhs[..., 2] = (q_KP @ y_JP.T)[:, None, :]
    total = mask_KP.sum(axis=1)[:, None, None].astype(float)
    return nnls3(g, rhs, total)


def nnls3(g: np.ndarray, rhs: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """min over c ≥ 0 of cᵀGc − 2cᵀr + total for many 3×3 problems (..., 3, 3), (..., 3), (...): (c (..., 3), the
    minimum (...)), by enumerating the supports (closed forms on the unit-diagonal scaled system)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        s = 1.0 / np.sqrt(np.einsum("...ii->...i", g))
        s = np.where(np.isfinite(s), s, 0.0)
        r = rhs * s
        off = {(0, 1): g[..., 0, 1] * s[..., 0] * s[..., 1], (0, 2): g[..., 0, 2] * s[..., 0] * s[..., 2],
               (1, 2): g[..., 1, 2] * s[..., 1] * s[..., 2]}
        shape = r.shape[:-1]
        best_c = np.zeros(r.shape)
        best_f = np.broadcast_to(np.asarray(total, float), shape).copy()

        def keep(c_list: list[np.ndarray], support: tuple[int, ...], ok: np.ndarray) -> None:
            f = best_f if not c_list else total - sum(c * r[..., i] for c, i in zip(c_list, support))
            ok = ok & np.isfinite(f) & (f < best_f) & np.all([c >= 0 for c in c_list], axis=0)
            best_f[...] = np.where(ok, f, best_f)
            for c, i in zip(c_list, support):
                best_c[..., i] = np.where(ok, c, best_c[..., i])
            for i in set(range(3)) - set(support):
                best_c[..., i] = np.where(ok, 0.0, best_c[..., i])

        for i in range(3):
            keep([r[..., i]], (i,), s[..., i] > 0)
        for i, j in ((0, 1), (0, 2), (1, 2)):
            x = off[(i, j)]
            det = 1.0 - x**2
            keep([(r[..., i] - x * r[..., j]) / det, (r[..., j] - x * r[..., i]) / det], (i, j),
                 (det > _SINGULAR) & (s[..., i] > 0) & (s[..., j] > 0))
        a, b, c = off[(0, 1)], off[(0, 2)], off[(1, 2)]
        det = 1.0 + 2 * a * b * c - a**2 - b**2 - c**2
        inv = ((1 - c**2, b * c - a, a * c - b), (b * c - a, 1 - b**2, a * b - c), (a * c - b, a * b - c, 1 - a**2))
        keep([(inv[i][0] * r[..., 0] + inv[i][1] * r[..., 1] + inv[i][2] * r[..., 2]) / det for i in range(3)],
             (0, 1, 2), (det > _SINGULAR) & np.all(s > 0, axis=-1))
        return best_c * s, best_f


def local_minima(f_IJ: np.ndarray) -> np.ndarray:
    """The cells (i, j) (M, 2) of the grid no neighbour (8-neighbourhood) is lower than, lowest first."""
    padded = np.pad(f_IJ, 1, constant_values=np.inf)
    i, j = f_IJ.shape
    lowest = np.ones(f_IJ.shape, bool)
    for di in (-1, 0, 1):
        for dj in (-1, 0, 1):
            if di or dj:
                lowest &= f_IJ <= padded[1 + di : 1 + di + i, 1 + dj : 1 + dj + j]
    cells = np.argwhere(lowest & np.isfinite(f_IJ))
    return cells[np.argsort(f_IJ[tuple(cells.T)], kind="stable")]
