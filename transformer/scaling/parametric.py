"""Chinchilla Approach 3: fit L(N, D) = E + A/N^α + B/D^β to final losses.

Legend: P = points, K = starting points (initialisations), 5 = the parameters (a, b, e, α, β).

Following Hoffmann et al. 2022 (and Besiroglu et al. 2024's replication), the fit is in log space:
log L̂ = LSE(a − α log N, b − β log D, e) with A = exp(a), B = exp(b), E = exp(e), and the objective is
a Huber loss (δ = 1e-3) on log L̂ − log L summed over points, minimised with L-BFGS-B from a grid of
initialisations: α, β ∈ {0, 0.5, …, 2}, e ∈ {−1, −0.5, …, 1}, a, b ∈ {0, 5, …, 25}; the best is kept.

The objective is evaluated on the whole grid at once (one vectorised call); L-BFGS-B then starts
from the `n_starts` grid points with the lowest initial objective. On the Chinchilla points the best
100 of the 4,500 starts reach the full grid's optimum to 1e-12 in objective.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import glob
import itertools
import os
from typing import Iterator

import numpy as np
import scipy
from scipy import optimize

from transformer.spec import ConfigError

HUBER_DELTA = 1e-3


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


def init_grid() -> np.ndarray:
    """Hoffmann et al.'s grid of initialisations, (4500, 5) as (a, b, e, α, β)."""
    values = (
        np.arange(0.0, 26.0, 5.0),  # a
        np.arange(0.0, 26.0, 5.0),  # b
        np.arange(-1.0, 1.01, 0.5),  # e
        np.arange(0.0, 2.01, 0.5),  # alpha
        np.arange(0.0, 2.01, 0.5),  # beta
    )
    return np.array(list(itertools.product(*values)))


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
        return self.E + self.A / np.power(params, self.alpha) + self.B / np.power(tokens, self.beta)

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


def fit_loss(
    params_P: np.ndarray,
    tokens_P: np.ndarray,
    loss_P: np.ndarray,
    *,
    n_starts: int | None = 100,
    extra_starts: np.ndarray | None = None,
    delta: float = HUBER_DELTA,
) -> LossFit:
    """Fit E + A/N^α + B/D^β by L-BFGS-B from the grid's best `n_starts` (None: all 4,500).

    `extra_starts` (M, 5) as (a, b, e, α, β) are tried as well (e.g. a previous solution).
    """
    if len(loss_P) < 5:
        raise ConfigError(f"approach 3 needs at least 5 points to fit 5 parameters, got {len(loss_P)}")
    log_n_P, log_d_P, log_loss_P = np.log(params_P), np.log(tokens_P), np.log(loss_P)
    grid_K5 = init_grid()
    if n_starts is not None and n_starts < len(grid_K5):
        initial_K, _ = objective_and_grad(grid_K5, log_n_P, log_d_P, log_loss_P, delta)
        grid_K5 = grid_K5[np.argsort(initial_K, kind="stable")[:n_starts]]
    if extra_starts is not None:
        grid_K5 = np.concatenate([np.asarray(extra_starts, dtype=float).reshape(-1, 5), grid_K5])

    def fun(x_5: np.ndarray) -> tuple[float, np.ndarray]:
        value_K, grad_K5 = objective_and_grad(x_5[None], log_n_P, log_d_P, log_loss_P, delta)
        return float(value_K[0]), grad_K5[0]

    best = None
    with single_threaded_blas():
        for x0_5 in grid_K5:
            result = optimize.minimize(fun, x0_5, jac=True, method="L-BFGS-B")
            if np.all(np.isfinite(result.x)) and (best is None or result.fun < best.fun):
                best = result
    a, b, e, alpha, beta = best.x
    with np.errstate(over="ignore"):  # a degenerate fit (e.g. a bootstrap resample) may give A or B = inf
        return LossFit(
            E=float(np.exp(e)), A=float(np.exp(a)), B=float(np.exp(b)),
            alpha=float(alpha), beta=float(beta), objective=float(best.fun),
        )
