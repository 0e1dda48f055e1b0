"""The two-step task law (Bhagia et al. 2024, "Establishing Task Scaling Laws via Compute-Efficient Model
Ladders", used by OLMo and Marin): compute → the task's correct-answer bits per byte (the first step: the fit of
`experiments.fit --metric=tasks/NAME/bits_per_byte`, its frontier, backtest and calibrated intervals), then bits
per byte → accuracy through a sigmoid fitted on every (bits per byte, accuracy) pair the sweep's runs logged (their
final and intermediate evaluations):

    acc(x) = floor + height / (1 + exp(k · (x − x0)))      k > 0: accuracy falls as bits per byte rises

A prediction's accuracy is the sigmoid at the predicted bits per byte; its 95% interval is the bits per byte
interval mapped through the sigmoid (monotonic), which leaves out the sigmoid's own uncertainty (said in `note`).
Numpy and scipy only.
"""
from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import scipy.optimize

from transformer.scaling import points as points_lib
from transformer.scaling import verdict
from transformer.spec import ConfigError, metric_keys

MIN_PAIRS = 6


def pairs(directory: str, x_metric: str, acc_metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(x [P], acc [P]) of every evaluation of the sweep's ok grid runs that logged both metrics (metrics.jsonl
    rows; a run without its file gives its results row's final values)."""
    records, _ = points_lib._read_jsonl(os.path.join(directory, "results.jsonl"))
    xs, accs = [], []
    for _, record in records:
        if record.get("role", "grid") != "grid" or verdict.verdict(record)[0] != verdict.OK:
            continue
        path = os.path.join(directory, "runs", str(record.get("run_id")), "metrics.jsonl")
        rows = [r for _, r in points_lib._read_jsonl(path)[0]] if os.path.isfile(path) else []
        found = [(r.get(x_metric), r.get(acc_metric)) for r in rows] or [
            (metric_keys.value(record, x_metric), metric_keys.value(record, acc_metric))]
        for x, acc in found:
            if all(isinstance(v, (int, float)) and math.isfinite(v) for v in (x, acc)):
                xs.append(float(x))
                accs.append(float(acc))
    return np.asarray(xs), np.asarray(accs)


def accuracy_at(sigmoid: dict[str, float], x: Any) -> Any:
    """The sigmoid's accuracy at bits per byte `x` (a number or an array)."""
    z = np.clip(sigmoid["k"] * (np.asarray(x, float) - sigmoid["x0"]), -500, 500)
    return sigmoid["floor"] + sigmoid["height"] / (1.0 + np.exp(z))


def fit_sigmoid(x_P: np.ndarray, acc_P: np.ndarray) -> dict[str, Any]:
    """The least-squares sigmoid (the module docstring) through the pairs, floor and floor + height within [0, 1];
    ConfigError with fewer than MIN_PAIRS pairs."""
    if len(x_P) < MIN_PAIRS:
        raise ConfigError(f"the two-step law needs at least {MIN_PAIRS} (bits per byte, accuracy) evaluations; the "
                          f"sweep's runs logged {len(x_P)}")
    lo, hi = float(np.min(acc_P)), float(np.max(acc_P))
    spread = float(np.ptp(x_P)) or 1.0
    p0 = [lo, max(hi - lo, 1e-3), 4.0 / spread, float(np.median(x_P))]
    bounds = ([0.0, 0.0, 1e-6, float(np.min(x_P)) - 2 * spread], [1.0, 1.0, 1e3, float(np.max(x_P)) + 2 * spread])

    def f(x: np.ndarray, floor: float, height: float, k: float, x0: float) -> np.ndarray:
        return accuracy_at({"floor": floor, "height": height, "k": k, "x0": x0}, x)

    params, _ = scipy.optimize.curve_fit(f, x_P, acc_P, p0=p0, bounds=bounds, maxfev=20000)
    sig = dict(zip(("floor", "height", "k", "x0"), (float(p) for p in params)))
    residual = acc_P - accuracy_at(sig, x_P)
    return {**sig, "pairs": int(len(x_P)), "rms_residual": float(np.sqrt(np.mean(residual ** 2))),
            "x_range": [float(np.min(x_P)), float(np.max(x_P))]}


def predict(sigmoid: dict[str, Any], predictions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each of fit.json's predictions (the task metric's `loss` and `loss_ci95` at a budget) as an accuracy with
    its mapped interval."""
    out = []
    for p in predictions:
        row: dict[str, Any] = {"flops": p["flops"], "bits_per_byte": p.get("loss"),
                               "bits_per_byte_ci95": p.get("loss_ci95")}
        if p.get("loss") is None:
            row.update(accuracy=None, accuracy_ci95=None, note=p.get("note", "no predicted bits per byte"))
        else:
            row["accuracy"] = float(accuracy_at(sigmoid, p["loss"]))
            ends = p.get("loss_ci95")
            row["accuracy_ci95"] = (sorted(float(accuracy_at(sigmoid, e)) for e in ends)
                                    if ends and None not in ends else None)
            row["note"] = ("the bits per byte interval mapped through the sigmoid (its own uncertainty not "
                           "included)") + ("; the predicted bits per byte lies outside the fitted pairs' range"
                                           if not sigmoid["x_range"][0] <= p["loss"] <= sigmoid["x_range"][1] else "")
        out.append(row)
    return out


def two_step(directory: str, x_metric: str, acc_metric: str, predictions: list[dict[str, Any]]) -> dict[str, Any]:
    """fit.json's `two_step`: the sigmoid fitted on the sweep's pairs and the predictions' accuracies."""
    x_P, acc_P = pairs(directory, x_metric, acc_metric)
    sigmoid = fit_sigmoid(x_P, acc_P)
    return {"metric": x_metric, "accuracy_metric": acc_metric, "sigmoid": sigmoid,
            "predictions": predict(sigmoid, predictions)}
