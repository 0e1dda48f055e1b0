"""The two backtests of a form of the loss at (N, D) inside the data: by model size and by tokens per parameter.

Legend: P = points, K = refits, S = distinct model sizes, J = backtest pairs.

Each refits the form on a part of the points (`fit_many(train_KP)`: one fit per row of a (K, P) mask, all at once)
and predicts the points beyond that part, at least MIN_DISTANCE beyond it (nearer ones measure noise, not misfit):
- by model size (`size_backtest`): for each k from max(MIN_SIZES, half of them) to all but the largest of the S
  distinct sizes, the refit sees the k smallest sizes and predicts every point of the larger ones, at the distance
  x = ln(N / N_k) beyond the refit's largest model;
- by tokens per parameter (`tpp_backtest`): for up to TPP_THRESHOLDS thresholds M_t, log-evenly spaced from the
  points' median M = D/N to M_max / 1.5 (each snapped to the largest M of a point at or below it), the refit sees
  the points with M ≤ M_t and predicts every point beyond, at the distance x = ln(M / M_t).
A refit needs MIN_SIZES sizes and 5 points. Each pair records e = ln(L̂ / L) (`log_error`) and x (`distance`).
`at_points` chooses the form by both and scales each direction's interval by its backtest's median |e|.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from transformer.scaling.points import Points

MIN_SIZES = 3  # a refit sees at least this many model sizes (and 5 points)
MIN_POINTS = 5
MIN_DISTANCE = float(np.log(1.5))  # pairs nearer the refit's data than 1.5× measure noise, not misfit
TPP_THRESHOLDS = 6  # at most this many refits in the tokens-per-parameter backtest

FitMany = Callable[[np.ndarray], Sequence[Any]]
LossFn = Callable[[Any, np.ndarray, np.ndarray], np.ndarray]


def _usable(points: Points, train_P: np.ndarray) -> bool:
    return int(train_P.sum()) >= MIN_POINTS and len(np.unique(points.params_P[train_P])) >= MIN_SIZES


def _pairs(points: Points, train_KP: np.ndarray, fit_many: FitMany, loss_fn: LossFn,
           distance_of: Callable[[int, np.ndarray], np.ndarray], record: Callable[[int], dict[str, float]]
           ) -> list[dict[str, float]]:
    out: list[dict[str, float]] = []
    if not len(train_KP):
        return out
    for k, (train_P, fit) in enumerate(zip(train_KP, fit_many(train_KP))):
        if fit is None:
            continue
        held = np.flatnonzero(~train_P)
        x_H = distance_of(k, held)
        with np.errstate(over="ignore", invalid="ignore"):
            pred_H = np.asarray(loss_fn(fit, points.params_P[held], points.tokens_P[held]), float)
        for i, x, predicted in zip(held, x_H, pred_H):
            if not (np.isfinite(predicted) and predicted > 0) or x < MIN_DISTANCE:
                continue
            out.append({**record(k), "params": float(points.params_P[i]), "tokens": float(points.tokens_P[i]),
                        "distance": float(x), "predicted": float(predicted), "measured": float(points.loss_P[i]),
                        "log_error": float(np.log(predicted / points.loss_P[i]))})
    return out


def size_backtest(points: Points, fit_many: FitMany, loss_fn: LossFn) -> list[dict[str, float]]:
    """The pairs of the backtest by model size (module docstring): {"k", "fit_params" (N_k), "params", "tokens",
    "distance" ln(N / N_k), "predicted", "measured", "log_error"}."""
    sizes_S = np.unique(points.params_P)
    ks = [k for k in range(max(MIN_SIZES, len(sizes_S) // 2), len(sizes_S))
          if _usable(points, points.params_P <= sizes_S[k - 1])]
    train_KP = np.array([points.params_P <= sizes_S[k - 1] for k in ks], bool).reshape(len(ks), len(points))
    return _pairs(points, train_KP, fit_many, loss_fn,
                  lambda j, held: np.log(points.params_P[held] / sizes_S[ks[j] - 1]),
                  lambda j: {"k": ks[j], "fit_params": float(sizes_S[ks[j] - 1])})


def tpp_thresholds(points: Points) -> list[float]:
    """The backtest's thresholds M_t on tokens per parameter (module docstring), each leaving a usable refit."""
    m_P = points.tokens_P / points.params_P
    m_sorted = np.unique(m_P)
    lo, hi = float(np.median(m_P)), float(m_sorted[-1] / np.exp(MIN_DISTANCE))
    if not hi > lo:
        return []
    snapped = [m_sorted[np.searchsorted(m_sorted, t * (1 + 1e-12), side="right") - 1]
               for t in np.geomspace(lo, hi, TPP_THRESHOLDS)]
    return [float(t) for t in np.unique(snapped) if _usable(points, m_P <= t)]


def tpp_backtest(points: Points, fit_many: FitMany, loss_fn: LossFn) -> list[dict[str, float]]:
    """The pairs of the backtest by tokens per parameter (module docstring): {"k" (the refit's index),
    "fit_tokens_per_param" (M_t), "params", "tokens", "distance" ln(M / M_t), "predicted", "measured",
    "log_error"}."""
    m_P = points.tokens_P / points.params_P
    thresholds = tpp_thresholds(points)
    train_KP = np.array([m_P <= t for t in thresholds], bool).reshape(len(thresholds), len(points))
    return _pairs(points, train_KP, fit_many, loss_fn, lambda j, held: np.log(m_P[held] / thresholds[j]),
                  lambda j: {"k": j, "fit_tokens_per_param": thresholds[j]})


def median_abs(bt_J: list[dict[str, float]]) -> float | None:
    """The median |log_error| of the pairs; None without pairs."""
    return float(np.median(np.abs([p["log_error"] for p in bt_J]))) if bt_J else None


def summary(bt_J: list[dict[str, float]], method: str) -> dict[str, Any]:
    """A backtest as fit.json stores it: the method, its pairs, and the median and max |log_error|."""
    out: dict[str, Any] = {"method": method, "pairs": bt_J, "median_abs_error": median_abs(bt_J)}
    if bt_J:
        out["max_abs_error"] = float(np.max(np.abs([p["log_error"] for p in bt_J])))
    return out
