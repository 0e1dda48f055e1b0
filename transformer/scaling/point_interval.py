"""The 95% interval of a predicted loss at (N, D): a noise term inside the data, and one term per direction of
extrapolation (model size, tokens per parameter), each growing with its distance and calibrated out of sample.

An asked (N, D) lies x_N = max(0, ln(N / N_max)) e-folds beyond the largest fitted model and x_M = max(0,
ln(M / M_max)) beyond the most tokens per parameter fitted (M = D/N); `distances` also gives those in compute
(C = 6ND) and in tokens, which are reported but do not set the width: in the published IsoFLOP backtests every
held-out point is inside the fitted compute range (x_C = 0) and still misses by 1–30%, so compute distance does
not tell the hard predictions from the easy ones. The interval is L̂·exp(±h),

    h = sqrt((t·σ)² + (m_N·b_N·g(x_N))² + (m_M·b_M·g(x_M))²),   g(x) = 1 + GROWTH·x for x > 0, else 0,

- σ: the noise sd in ln L (the chosen form's log residual RMS, "fit_residuals"), t the Student-t 97.5% quantile
  with the form's residual degrees of freedom: the whole width inside the data (x_N = x_M = 0);
- b_N, b_M: the chosen form's median |log error| in its own backtests by model size and by tokens per parameter
  (`point_backtests`): how far this form, on these data, misses one step beyond what it saw. Where one backtest
  has no pair the other's stands in; where neither has, the residual RMS (the interval says it is not calibrated);
- g: a prediction beyond the data in a direction, by any amount, gets that direction's whole term, which grows by
  GROWTH per e-fold: in the published hold-outs the error is mostly a shift shared by every held-out point of a
  fit, as large just beyond the data as further out (a term that ramps in over the first ln 1.5 gave wider
  intervals at the same coverage: docs/fitting.md);
- m_N = SIZE_MULTIPLIER, m_M = TPP_MULTIPLIER: calibrated on the hold-outs of published grids and the CPU
  over-training ladder (`experiments.reproduce`, `experiments.reproduce_points`): each set refitted on part of
  its points predicts the rest, by size (sizes ≤ N_max/2, ≤ N_max/4) and by tokens per parameter (points at
  ≤ 10 and ≤ 40 tokens per parameter); a point's score is the m its term needs to reach its error; m is the
  COVERAGE quantile of the scores with each (set, hold-out) weighted equally (CALIBRATION holds the figures and
  the data each constant came from). Out of sample (each data source's m from the other sources) the tables in
  docs/fitting.md "Loss at any (N, D)".
"""
from __future__ import annotations

from typing import Any

import numpy as np
from scipy import special

from transformer.scaling.interval import NO_NOISE, Interval, none

COVERAGE = 0.95
GROWTH = 1.0  # the terms' growth per e-fold of extrapolation (chosen among 0, 0.5, 1, 2: docs/fitting.md)
SIZE_MULTIPLIER = 3.6
TPP_MULTIPLIER = 1.35
CALIBRATION = {
    "size": "",
    "tokens_per_param": "",
}
DIRECTIONS = ("size", "tokens_per_param")


def distances(params: float, tokens: float, n_max: float, m_max: float, c_max: float,
              d_max: float) -> dict[str, float]:
    """E-folds beyond the fitted data (0 inside): in model size, tokens per parameter, compute (6ND) and tokens."""
    return {"params": max(0.0, float(np.log(params / n_max))),
            "tokens_per_param": max(0.0, float(np.log(tokens / params / m_max))),
            "compute": max(0.0, float(np.log(6.0 * params * tokens / c_max))),
            "tokens": max(0.0, float(np.log(tokens / d_max)))}


def growth(x: float) -> float:
    """g(x) of the module docstring: 0 inside the data, 1 + GROWTH·x beyond it."""
    return 0.0 if x <= 0 else 1.0 + GROWTH * x


def scales(b_size: float | None, b_tpp: float | None, fallback: float | None) -> dict[str, Any]:
    """{"size", "tokens_per_param": the scale b of each direction's term, "from": where each came from,
    "calibrated": whether a backtest set them}: a backtest's median |log error|, else the other backtest's, else
    `fallback` (the residual RMS), else 0."""
    out: dict[str, Any] = {"from": {}, "calibrated": b_size is not None or b_tpp is not None}
    for name, own, other in (("size", b_size, b_tpp), ("tokens_per_param", b_tpp, b_size)):
        if own is not None:
            out[name], out["from"][name] = float(own), f"the backtest by {name.replace('_', ' ')}"
        elif other is not None:
            out[name], out["from"][name] = float(other), "the other backtest (this one has no pair)"
        else:
            out[name], out["from"][name] = float(fallback or 0.0), "the residual RMS (no backtest pair: not calibrated)"
    return out


def interval(loss: float, x: dict[str, float], noise_sd: float | None, dof: int, scale: dict[str, Any],
             source: str) -> tuple[Interval, dict[str, Any]]:
    """The 95% interval of `loss` at the distances `x` (`distances`), with the noise sd `noise_sd` in ln L from
    `source` (`interval.SOURCES`; None: no noise term) and `dof` residual degrees of freedom, and `scale`
    (`scales`); and its terms: fit.json's `loss_interval` (what drives it: each term's half-width in ln L, the
    distances, the multipliers, and which term is the largest)."""
    noise_sd = float(noise_sd) if noise_sd is not None and np.isfinite(noise_sd) and noise_sd > 0 else 0.0
    source = source if noise_sd > 0 else "none"
    t = float(special.stdtrit(max(dof, 1), (1 + COVERAGE) / 2))
    terms = {"noise": t * noise_sd,
             "size": SIZE_MULTIPLIER * scale["size"] * growth(x["params"]),
             "tokens_per_param": TPP_MULTIPLIER * scale["tokens_per_param"] * growth(x["tokens_per_param"])}
    half = float(np.sqrt(sum(v * v for v in terms.values())))
    calibrated = scale["calibrated"] and (x["params"] > 0 or x["tokens_per_param"] > 0)
    if half <= 0:
        ci = none(f"{NO_NOISE}, and the prediction is inside the fitted range: no interval")
    else:
        with np.errstate(over="ignore"):
            lo, hi = float(loss * np.exp(-half)), float(loss * np.exp(half))
        ci = Interval(lo, hi, source, 1.0, None if source != "none" else
                      f"{NO_NOISE}: the extrapolation terms alone, no noise term") if np.isfinite(hi) else \
            Interval(None, None, source, 1.0, "the extrapolation terms run away: no finite interval")
    record = {"distance": x["params"] + x["tokens_per_param"], "distances": x, "half_width_log": half,
              "terms_log": terms, "driven_by": max(terms, key=terms.get) if half > 0 else None,
              "noise_sd_log": noise_sd, "sigma_log": half / t if t > 0 else None, "t": t,
              "multipliers": {"size": SIZE_MULTIPLIER, "tokens_per_param": TPP_MULTIPLIER},
              "scales_log": {d: scale[d] for d in DIRECTIONS}, "growth_per_efold": GROWTH,
              "calibrated": bool(calibrated and ci.exists), "source": source,
              "method": "ln L ± sqrt((t·σ)² + (m_N·b_N·g(x_N))² + (m_M·b_M·g(x_M))²), g(x) = 1 + "
                        f"{GROWTH:g}·x beyond the data; b: the form's backtest median |error| per direction; m: calibrated out of "
                        "sample on published hold-outs (point_interval.CALIBRATION)"}
    return ci, record
