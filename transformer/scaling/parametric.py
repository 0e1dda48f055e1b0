"""Chinchilla Approach 3: fit L(N, D) = E + A/N^α + B/D^β to final losses.

Legend: P = points, K = problems fitted at once, M = starting points, 5 = the parameters (a, b, e, α, β).

The objective is Hoffmann et al. 2022's (and Besiroglu et al. 2024's replication): in log space,
log L̂ = LSE(a − α log N, b − β log D, e) with A = exp(a), B = exp(b), E = exp(e), a Huber loss (δ = 1e-3) on
log L̂ − log L summed over points.

How its minimum is found (variable projection, `varpro`; VPNLS, arXiv 2603.22339): for each (α, β) on a grid
(0 to 3 in steps of 0.025), E, A, B ≥ 0 come from non-negative least squares on the relative residuals, exact for
that squared loss; the Huber objective is then evaluated at every cell's (E, A, B, α, β), and all five
parameters are refined (Levenberg–Marquardt on the Huber objective, `batch_lm`) from the BASINS lowest local
minima of that landscape, and the best polished by L-BFGS-B. The grid depends on nothing but the fixed ranges,
so there are no starting points to choose: before, L-BFGS-B ran from the 100 best of Hoffmann et al.'s 4,500
initialisations (α, β ∈ {0, 0.5, …, 2}, e ∈ {−1, …, 1}, a, b ∈ {0, 5, …, 25}), 1.3 s per fit. Refits of many
problems at once (noise draws, hold-outs: `fit_batch`) use a coarser grid and start also from the full fit.
`tests/test_parametric_vp.py` checks the optimum on every published set we have against a reference from scipy
alone (a dense grid with `scipy.optimize.nnls`, then `least_squares` with its Huber loss): the `vpnls` package, the
paper's own, has no distribution on the package index this project reaches.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import glob
import os
from typing import Iterator

import numpy as np
import scipy
from scipy import optimize

from transformer.spec import ConfigError
from transformer.scaling import batch_lm, varpro

HUBER_DELTA = 1e-3
BASINS = 8  # the fit refines from this many lowest local minima of the profile grid's Huber landscape
BATCH_CELLS = 3  # fit_batch: the Huber objective at this many lowest local minima of each problem's LS profile
# L-BFGS-B's tolerances for the final polish: scipy's defaults (ftol 2.2e-9) stop after one step in the flat valleys a
# Huber loss with most residuals beyond δ makes (OpenWebText2 no-decay: objective 1.5e-5 above the optimum).
POLISH = {"ftol": 1e-15, "gtol": 1e-10, "maxiter": 2000}
FLOOR = 1e-9  # a coefficient NNLS sets to 0 starts at this fraction of the lowest loss


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Run scipy's bundled OpenBLAS on one thread inside the block (a no-op where it is absent).

    L-BFGS-B calls BLAS on 5×5 matrices thousands of times; OpenBLAS waking its thread pool for
    each call made the fit 10–40× slower on a loaded 2-core machine (0.6 s → 7–30 s).
    """
    libs = []
    for path in glob.glob(os.path.join(os.path.dirname(scipy.__file__), os.pardir, "scipy.libs", "*openblas*")):
        lib = ctypes.CDLL(path)
        if hasattr(lib, "scipy_openblas_get_num_threads") and hasattr(lib, "scipy_openblas_set_num_threads"):
            libs.append((lib, lib.scipy_openblas_get_num_threads()))
    try:
        for lib, _ in libs:
            lib.scipy_openblas_set_num_threads(1)
        yield
    finally:
        for lib, threads in libs:
            lib.scipy_openblas_set_num_threads(threads)


def law_loss(e: np.ndarray | float, a: np.ndarray | float, b: np.ndarray | float, alpha: np.ndarray | float,
             beta: np.ndarray | float, params: np.ndarray | float, tokens: np.ndarray | float) -> np.ndarray:
    """E + A/N^α + B/D^β, broadcasting (e.g. K draws of the parameters against Q points), each term as
    exp(ln A − α ln N) so that a coefficient of 0 gives 0 whatever its exponent (0/N^α is NaN where N^α overflows)."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        return (e + np.exp(np.log(a) - alpha * np.log(params)) + np.exp(np.log(b) - beta * np.log(tokens)))


@dataclasses.dataclass(frozen=True)
class LossFit:
    """The fitted L(N, D) = E + A/N^α + B/D^β and its objective value."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    objective: float

    @property
    def x(self) -> np.ndarray:
        """The parameters as (a, b, e, α, β)."""
        return np.array([np.log(self.A), np.log(self.B), np.log(self.E), self.alpha, self.beta])

    @property
    def a(self) -> float:
        """N_opt ∝ C^a with a = β/(α+β)."""
        return self.beta / (self.alpha + self.beta)

    @property
    def b(self) -> float:
        """D_opt ∝ C^b with b = α/(α+β)."""
        return self.alpha / (self.alpha + self.beta)

    @property
    def G(self) -> float:
        """G = (αA/(βB))^(1/(α+β)), so that N_opt = G·(C/6)^a and D_opt = (C/6)^b / G; NaN when a
        degenerate fit (β·B underflowed to 0, or α+β = 0) leaves it undefined."""
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            ratio = np.float64(self.alpha) * self.A / (np.float64(self.beta) * self.B)
            g = ratio ** (1.0 / (self.alpha + self.beta)) if self.alpha + self.beta > 0 else np.nan
        return float(g) if np.isfinite(g) and g > 0 else float("nan")

    def loss(self, params: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Predicted loss L(N, D), broadcasting N and D."""
        return law_loss(self.E, self.A, self.B, self.alpha, self.beta, params, tokens)

    def n_opt(self, flops: np.ndarray) -> np.ndarray:
        """Compute-optimal N for compute C, under C = 6·N·D."""
        return self.G * np.power(np.asarray(flops) / 6.0, self.a)

    def d_opt(self, flops: np.ndarray) -> np.ndarray:
        """Compute-optimal D for compute C, under C = 6·N·D."""
        return np.power(np.asarray(flops) / 6.0, self.b) / self.G


def objective_and_grad(
    x_K5: np.ndarray, log_n_P: np.ndarray, log_d_P: np.ndarray, log_loss_P: np.ndarray,
    delta: float = HUBER_DELTA,
) -> tuple[np.ndarray, np.ndarray]:
    """Summed Huber loss of each of K parameter vectors, (K,), and its gradient, (K, 5)."""
    a, b, e, alpha, beta = (x_K5[:, i : i + 1] for i in range(5))
    terms_3KP = np.stack(
        [a - alpha * log_n_P, b - beta * log_d_P, np.broadcast_to(e, (len(x_K5), len(log_n_P)))]
    )
    top_KP = terms_3KP.max(axis=0)
    weights_3KP = np.exp(terms_3KP - top_KP)
    total_KP = weights_3KP.sum(axis=0)
    residual_KP = top_KP + np.log(total_KP) - log_loss_P
    weights_3KP /= total_KP  # d LSE / d term
    abs_KP = np.abs(residual_KP)
    huber_K = np.where(abs_KP <= delta, 0.5 * residual_KP**2, delta * (abs_KP - 0.5 * delta)).sum(axis=1)
    dr_KP = np.clip(residual_KP, -delta, delta)
    grad_K5 = np.stack(
        [
            (dr_KP * weights_3KP[0]).sum(axis=1),
            (dr_KP * weights_3KP[1]).sum(axis=1),
            (dr_KP * weights_3KP[2]).sum(axis=1),
            -(dr_KP * weights_3KP[0] * log_n_P).sum(axis=1),
            -(dr_KP * weights_3KP[1] * log_d_P).sum(axis=1),
        ],
        axis=1,
    )
    return huber_K, grad_K5


def residuals_and_jacobian(x_K5: np.ndarray, u_P: np.ndarray, v_P: np.ndarray,
                           log_loss_KP: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ln L̂ − ln L of K parameter vectors (a_c, b_c, e, α, β) in centred units (ln N − c_N, ln D − c_D as u, v):
    residuals (K, P) and their Jacobian (K, P, 5); `log_loss_KP` (K, P) or (1, P)."""
    a, b, e, alpha, beta = (x_K5[:, i : i + 1] for i in range(5))
    terms_3KP = np.stack([a - alpha * u_P, b - beta * v_P, np.broadcast_to(e, (len(x_K5), len(u_P)))])
    top_KP = terms_3KP.max(axis=0)
    weights_3KP = np.exp(terms_3KP - top_KP)
    total_KP = weights_3KP.sum(axis=0)
    weights_3KP /= total_KP
    residual_KP = top_KP + np.log(total_KP) - log_loss_KP
    jac_KP5 = np.stack([weights_3KP[0], weights_3KP[1], weights_3KP[2], -weights_3KP[0] * u_P, -weights_3KP[1] * v_P],
                       axis=-1)
    return residual_KP, jac_KP5


def _starts_from_cells(coef_M3: np.ndarray, alpha_M: np.ndarray, beta_M: np.ndarray, floor: float) -> np.ndarray:
    """Grid cells' NNLS coefficients (E, A_c, B_c) as starts (a_c, b_c, e, α, β), (M, 5); a coefficient NNLS set to
    0 starts at `floor` (its logarithm must be finite)."""
    log_c = np.log(np.maximum(coef_M3, floor))
    return np.stack([log_c[:, 1], log_c[:, 2], log_c[:, 0], alpha_M, beta_M], axis=1)


def _to_fit(x_5: np.ndarray, centre_n: float, centre_d: float, objective: float) -> LossFit:
    a_c, b_c, e, alpha, beta = (float(v) for v in x_5)
    with np.errstate(over="ignore"):  # a degenerate fit (e.g. a bootstrap draw) may give A or B = inf
        return LossFit(E=float(np.exp(e)), A=float(np.exp(a_c + alpha * centre_n)),
                       B=float(np.exp(b_c + beta * centre_d)), alpha=alpha, beta=beta, objective=float(objective))


def _centred(start_M5: np.ndarray, centre_n: float, centre_d: float) -> np.ndarray:
    """Starts (a, b, e, α, β) in the original units as centred ones (a_c = a − α·c_N, b_c = b − β·c_D)."""
    x = np.array(start_M5, float).reshape(-1, 5)
    x[:, 0] -= x[:, 3] * centre_n
    x[:, 1] -= x[:, 4] * centre_d
    return x


def fit_loss(
    params_P: np.ndarray,
    tokens_P: np.ndarray,
    loss_P: np.ndarray,
    *,
    extra_starts: np.ndarray | None = None,
    basins: int = BASINS,
    delta: float = HUBER_DELTA,
) -> LossFit:
    """Fit E + A/N^α + B/D^β: the (α, β) profile grid (`varpro`), the Huber objective at every cell's NNLS
    solution, L-M refinement (`batch_lm`) of all five parameters from the `basins` lowest local minima of that
    landscape (and from `extra_starts` (M, 5) as (a, b, e, α, β), e.g. a previous solution), then L-BFGS-B from
    the best (scipy's stopping rule, as the fit before variable projection)."""
    if len(loss_P) < 5:
        raise ConfigError(f"approach 3 needs at least 5 points to fit 5 parameters, got {len(loss_P)}")
    log_n_P, log_d_P, log_loss_P = np.log(params_P), np.log(tokens_P), np.log(loss_P)
    c_n, c_d = varpro.centre(log_n_P, log_d_P)
    u_P, v_P = log_n_P - c_n, log_d_P - c_d
    grid = varpro.ALPHA_GRID
    coef_IJ3, _ = varpro.profile(u_P, v_P, np.asarray(loss_P, float)[None], np.ones((1, len(u_P))), grid, grid)
    coef_IJ3 = coef_IJ3[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        pred_IJP = (coef_IJ3[..., 0:1] + coef_IJ3[..., 1:2] * np.exp(-grid[:, None, None] * u_P)
                    + coef_IJ3[..., 2:3] * np.exp(-grid[None, :, None] * v_P))
        huber_IJ = batch_lm.objective(np.log(pred_IJP) - log_loss_P, np.ones(len(u_P)), delta)
    cells_M2 = varpro.local_minima(huber_IJ)[:basins]
    starts_M5 = _starts_from_cells(coef_IJ3[tuple(cells_M2.T)], grid[cells_M2[:, 0]], grid[cells_M2[:, 1]],
                                   FLOOR * float(np.min(loss_P)))
    if extra_starts is not None:
        starts_M5 = np.concatenate([_centred(extra_starts, c_n, c_d), starts_M5])
    x_M5, f_M = batch_lm.minimize(lambda x, idx: residuals_and_jacobian(x, u_P, v_P, log_loss_P[None]), starts_M5,
                                  np.ones((1, len(u_P))), delta=delta)
    best_5 = x_M5[int(np.argmin(f_M))]

    def fun(x_5: np.ndarray) -> tuple[float, np.ndarray]:
        value_K, grad_K5 = objective_and_grad(x_5[None], u_P, v_P, log_loss_P, delta)
        return float(value_K[0]), grad_K5[0]

    with single_threaded_blas(), np.errstate(over="ignore", invalid="ignore"):
        polished = optimize.minimize(fun, best_5, jac=True, method="L-BFGS-B", options=POLISH)
    if np.all(np.isfinite(polished.x)) and polished.fun <= float(np.min(f_M)):
        best_5, value = polished.x, float(polished.fun)
    else:
        value = float(np.min(f_M))
    return _to_fit(best_5, c_n, c_d, value)


def fit_batch(
    params_P: np.ndarray,
    tokens_P: np.ndarray,
    loss_KP: np.ndarray,
    mask_KP: np.ndarray | None = None,
    *,
    warm_start: LossFit | None = None,
    delta: float = HUBER_DELTA,
) -> list[LossFit | None]:
    """K fits at once (noise draws: `loss_KP` (K, P); refits on subsets: `mask_KP` (K, P), 1 where problem k uses
    point p), each refined by L-M from the best cell of the coarse profile grid (by the Huber objective among the
    lowest BATCH_CELLS local minima of its least-squares profile) and from `warm_start` (e.g. the fit on all the
    data), the better kept. None for a problem with fewer than 5 points."""
    loss_KP = np.asarray(loss_KP, float)
    mask_KP = np.ones(loss_KP.shape) if mask_KP is None else np.broadcast_to(np.asarray(mask_KP, float), loss_KP.shape)
    log_n_P, log_d_P = np.log(params_P), np.log(tokens_P)
    c_n, c_d = varpro.centre(log_n_P, log_d_P, mask_KP > 0)
    u_P, v_P = log_n_P - c_n, log_d_P - c_d
    log_loss_KP = np.log(loss_KP)
    grid = varpro.COARSE_GRID
    coef_KIJ3, ls_KIJ = varpro.profile(u_P, v_P, loss_KP, mask_KP, grid, grid)
    starts = []
    for k in range(len(loss_KP)):
        cells_M2 = varpro.local_minima(ls_KIJ[k])[:BATCH_CELLS]
        coef_M3 = coef_KIJ3[k][tuple(cells_M2.T)]
        alpha_M, beta_M = grid[cells_M2[:, 0]], grid[cells_M2[:, 1]]
        with np.errstate(divide="ignore", invalid="ignore"):
            pred_MP = coef_M3[:, 0:1] + coef_M3[:, 1:2] * np.exp(-alpha_M[:, None] * u_P) \
                + coef_M3[:, 2:3] * np.exp(-beta_M[:, None] * v_P)
            f_M = batch_lm.objective(np.log(pred_MP) - log_loss_KP[k], mask_KP[k], delta)
        m = int(np.argmin(f_M))
        floor = FLOOR * float(np.min(loss_KP[k][mask_KP[k] > 0]))
        starts.append(_starts_from_cells(coef_M3[m : m + 1], alpha_M[m : m + 1], beta_M[m : m + 1], floor)[0])
    starts_S5 = np.array(starts)
    owner_S = np.arange(len(loss_KP))
    if warm_start is not None and np.all(np.isfinite(warm_start.x)):
        starts_S5 = np.concatenate([starts_S5, _centred(np.tile(warm_start.x, (len(loss_KP), 1)), c_n, c_d)])
        owner_S = np.concatenate([owner_S, owner_S])
    x_S5, f_S = batch_lm.minimize(
        lambda x, idx: residuals_and_jacobian(x, u_P, v_P, log_loss_KP[owner_S[idx]]), starts_S5,
        mask_KP[owner_S], delta=delta)
    out: list[LossFit | None] = []
    for k in range(len(loss_KP)):
        if mask_KP[k].sum() < 5:
            out.append(None)
            continue
        mine = np.flatnonzero(owner_S == k)
        s = mine[int(np.argmin(f_S[mine]))]
        out.append(_to_fit(x_S5[s], c_n, c_d, f_S[s]))
    return out
