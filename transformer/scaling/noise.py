"""The noise of the final losses, σ in ln L (≈ relative), that the fits' intervals are drawn from.

Legend: P = points, S = distinct sizes of one budget, R = residuals.

Two sources, in order of preference:
- seed replicates: points of one budget with equal N (so equal D; trained under several seeds); σ is their
  pooled within-group standard deviation of ln L.
- residuals: where no point has a replicate, the scatter of each budget's ln L about a local smooth curve:
  a cubic in ln N through the 7 sizes around the budget's lowest loss (a parabola where only 4 sizes are
  there), pooled over budgets, with a robust scale (1.4826 · median |r|, scaled by √(R/dof)) so that a
  few sizes far off the curve do not inflate it. Curvature the local cubic misses counts as noise: the
  estimate errs wide.
On Porian et al.'s points the residual estimate gives intervals for a 0.5–2.4× as wide as their
seed-noise ones, covering the published a on all 15 settings (docs/sweeps.md).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from transformer.scaling import isoflop
from transformer.scaling.points import Points

RESIDUAL_HALF_WINDOW = 3  # sizes each side of the lowest loss in the local residual fit
MAD_TO_SD = 1.4826


def replicate_sigma(points: Points, groups: list[np.ndarray]) -> tuple[float, int]:
    """Pooled standard deviation of ln L within replicate groups and its degrees of freedom (0: none)."""
    squares, dof = 0.0, 0
    for idx in groups:
        inverse_P, reps_S = isoflop.size_index(points, idx)
        log_loss_P = np.log(points.loss_P[idx])
        mean_S = np.bincount(inverse_P, weights=log_loss_P) / reps_S
        squares += float(((log_loss_P - mean_S[inverse_P]) ** 2).sum())
        dof += int((reps_S - 1).sum())
    return (float(np.sqrt(squares / dof)) if dof else float("nan")), dof


def residual_sigma(points: Points, groups: list[np.ndarray]) -> tuple[float, int]:
    """Robust pooled scatter of ln L about a local cubic per budget (see the module docstring)."""
    residuals, dof = [], 0
    for idx in groups:
        s = isoflop.sizes(points, idx)
        best = int(np.argmin(s["log_loss"]))
        window = slice(max(0, best - RESIDUAL_HALF_WINDOW), best + RESIDUAL_HALF_WINDOW + 1)
        x_S, y_S = s["log_n"][window], s["log_loss"][window]
        degree = 3 if len(x_S) >= 5 else 2 if len(x_S) == 4 else None
        if degree is None:
            continue
        residuals.extend(y_S - np.polyval(np.polyfit(x_S, y_S, degree), x_S))
        dof += len(x_S) - degree - 1
    if not dof:
        return float("nan"), 0
    r_R = np.array(residuals)
    return float(MAD_TO_SD * np.median(np.abs(r_R)) * np.sqrt(len(r_R) / dof)), dof


def estimate(points: Points) -> dict[str, Any]:
    """{"sigma", "source", "kind", "dof", "sigma_nats"} (σ_nats = σ × the median loss; kind "seeds", "residuals"
    or "none", the intervals' `interval.SOURCES` name); sigma None when neither replicates nor budgets with ≥ 4
    sizes are there."""
    groups = isoflop.group_budgets(points.flops_P, budget_P=points.budget_P)
    sigma, dof = replicate_sigma(points, groups)
    source, kind = "seed replicates (pooled sd of ln L within points of equal budget and N)", "seeds"
    if not dof:
        kind = "residuals"
        sigma, dof = residual_sigma(points, groups)
        source = (f"residuals of ln L about a local cubic in ln N ({2 * RESIDUAL_HALF_WINDOW + 1} sizes around "
                  "each budget's minimum; robust scale); no seed replicates")
    if not dof or not np.isfinite(sigma) or sigma <= 0:
        return {"sigma": None, "source": "none: no seed replicates and no budget with 4 or more sizes",
                "kind": "none", "dof": 0, "sigma_nats": None}
    return {"sigma": sigma, "source": source, "kind": kind, "dof": dof,
            "sigma_nats": float(sigma * np.median(points.loss_P))}


def draw_losses(loss_P: np.ndarray, sigma: float, samples: int, rng: np.random.Generator) -> np.ndarray:
    """`samples` noisy copies of the losses, L·exp(σ·z): (K, P)."""
    return loss_P[None, :] * np.exp(sigma * rng.normal(0.0, 1.0, (samples, len(loss_P))))
