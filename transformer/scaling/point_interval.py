"""The 95% interval of a predicted loss at (N, D): a noise term inside the data, and one term per direction of
extrapolation (model size, tokens per parameter), each growing with its distance and calibrated out of sample.

An asked (N, D) lies x_N e-folds outside the fitted model sizes (ln(N / N_max) above the largest, ln(N_min / N)
below the smallest) and x_M outside the fitted tokens per parameter (M = D/N; approach 3's default fit keeps the
points within 3× of each budget's optimum, so a model trained on far fewer tokens than that is outside it too);
`distances` also gives those in compute (C = 6ND) and in tokens, which are reported but do not set the width: in
the hold-outs below, 94% of the held-out points are inside the fitted compute range (x_C = 0) and still miss by up
to 30%, so the distance in compute does not tell the hard predictions from the easy ones. The interval is L̂·exp(±h),

    h = sqrt((t·σ)² + (m_N·s_N·g_N(x_N))² + (m_M·s_M·g_M(x_M))²),   g(x) = 1 + G·x for x > 0, else 0,

- σ: the noise sd in ln L (the chosen form's log residual RMS, "fit_residuals"), t the Student-t 97.5% quantile
  with the form's residual degrees of freedom: the whole width inside the data (x_N = x_M = 0);
- b_N, b_M: the chosen form's median |log error| in its own backtests by model size and by tokens per parameter
  (`point_backtests`): how far this form, on these data, misses one step beyond what it saw. Where one backtest
  has no pair the other's stands in; where neither has, the residual RMS (the interval says it is not calibrated);
- s = b_ref·(b / b_ref)^w (`effective_scale`, b_ref = 1%, w = SCALE_POWER[direction]): w_N = 0.7 in model size,
  where the hold-outs' errors grow less than in proportion to their backtests' (with s = b, the hold-outs with the
  smallest third of b were covered 87% and the largest third 99%; with w_N = 0.7, 93.5% and 96.4%), w_M = 1;
- g: a prediction beyond the data in a direction, by any amount, gets that direction's whole term, which grows by
  G = GROWTH[direction] per e-fold: G_N = 1 in model size (in the published hold-outs the error is mostly a shift
  shared by every held-out point of a fit, as large just beyond the data as further out; a term that ramps in over
  the first ln 1.5 gave wider intervals at the same coverage), G_M = 8 in tokens per parameter (its errors grow
  with the distance: 1.1% median just beyond the fitted tokens per parameter, 9.7% at 8× beyond). Each G is the
  one under which the out-of-sample coverage does not depend on the distance (docs/fitting.md);
- m_N = SIZE_MULTIPLIER, m_M = TPP_MULTIPLIER: calibrated on the hold-outs of published grids and the CPU
  over-training ladder (`experiments.reproduce`, `experiments.reproduce_points`): each set refitted on part of
  its points predicts the rest trained on ≥ 1 token per parameter, by size (sizes ≤ N_max/2, ≤ N_max/4) and by
  tokens per parameter (points at ≤ 10 and ≤ 40 tokens per parameter); a point's score is the m its term needs to reach its error; m is the
  COVERAGE quantile of the scores with each (set, hold-out) weighted equally (CALIBRATION holds the figures and
  the data each constant came from). Out of sample (each data source's m from the other sources) the tables in
  docs/fitting.md "Loss at any (N, D)".
"""
from __future__ import annotations

from typing import Any

import numpy as np
from scipy import special

from transformer.scaling.backtest import COVERAGE  # noqa: F401 (one 95% for every interval; re-exported)
from transformer.scaling.interval import NO_NOISE, Interval, none

# Each term's growth per e-fold of extrapolation: chosen among 0, 0.5, 1, 2, 4 (size) and 0.5–64 (tokens per
# parameter) on the hold-outs below, the value under which coverage is flat in the distance (docs/fitting.md; both
# were 1 until 2026-11-27).
GROWTH = {"size": 1.0, "tokens_per_param": 8.0}
# Each term's scale s = SCALE_REF·(b / SCALE_REF)^w: the power w chosen among 0.25–1 on the hold-outs below (size: 0.7 for
# 12 of 19 data sources chosen on the others, 0.5 for the rest; tokens per parameter: 1), the value under which
# coverage does not depend on b (docs/fitting.md; both 1 until 2026-11-27).
SCALE_POWER = {"size": 0.7, "tokens_per_param": 1.0}
SCALE_REF = 0.01
# The multipliers: the split-conformal 95% quantiles of the hold-out scores (`experiments.reproduce_points.multipliers`,
# `backtest.conformal_multiplier` with each (set, hold-out) weighted equally), 1.986 and 0.257 over 43 hold-outs by size
# and 44 by tokens per parameter of the 21 published IsoFLOP sets and the CPU ladder, rounded up. Out of sample (each
# source's from the other sources'): by size 1.96–2.07, by tokens per parameter 0.227–0.262. (With both growths and
# both scale powers 1, until 2026-11-27: 2.12 and 1.25.)
SIZE_MULTIPLIER = 1.99
TPP_MULTIPLIER = 0.26
CALIBRATION = {
    "size": ("95% quantile of the scores of hold-outs by model size (refit on the sizes ≤ N_max/2 and ≤ N_max/4, "
             "predict the larger ones at ≥ 1 token per parameter): Porian et al. 2024's 15 settings "
             "(porian2024_isoflop_points.csv), Chinchilla (Epoch AI's extraction), the Open-Athena set's 5 experiments "
             "(ml_scalefit and Epoch AI Chinchilla, Li et al. 2025 misfitting, Llama 3 raw and exp loss), the CPU "
             "over-training ladder (overtrain_ladder_cpu.csv); python -m experiments.reproduce"),
    "tokens_per_param": ("95% quantile of the scores of hold-outs by tokens per parameter (refit on the points at ≤ 10 "
                         "and ≤ 40 tokens per parameter, predict the rest): the same 22 sets; python -m "
                         "experiments.reproduce"),
}
DIRECTIONS = ("size", "tokens_per_param")


def _outside(value: float, lo: float, hi: float) -> float:
    return max(0.0, float(np.log(value / hi)), float(np.log(lo / value)))


def distances(params: float, tokens: float, fitted: dict[str, float]) -> dict[str, float]:
    """E-folds outside the fitted range (0 inside; above its largest or below its smallest value), in model size,
    tokens per parameter, compute (6ND) and tokens; `fitted`: {"params_min", "params_max", ...} of each."""
    values = {"params": params, "tokens_per_param": tokens / params, "compute": 6.0 * params * tokens,
              "tokens": tokens}
    return {k: _outside(v, fitted[f"{k}_min"], fitted[f"{k}_max"]) for k, v in values.items()}


def fitted_range(params_P: np.ndarray, tokens_P: np.ndarray) -> dict[str, float]:
    """The smallest and largest model size, tokens per parameter, compute and tokens of the fitted points."""
    values = {"params": params_P, "tokens_per_param": tokens_P / params_P, "compute": 6.0 * params_P * tokens_P,
              "tokens": tokens_P}
    return {f"{k}_{end}": float(f(v)) for k, v in values.items() for end, f in (("min", np.min), ("max", np.max))}


def effective_scale(b: float, direction: str) -> float:
    """s of the module docstring: the backtest scale `b` (a median |log error|) of `direction` as its term uses it,
    SCALE_REF·(b / SCALE_REF)^SCALE_POWER[direction] (0 for b ≤ 0)."""
    return 0.0 if b <= 0 else SCALE_REF * (b / SCALE_REF) ** SCALE_POWER[direction]


def unit(b: float, x: float, direction: str) -> float:
    """A direction's term before its multiplier: s(b)·g(x) (`effective_scale`, `growth`)."""
    return effective_scale(b, direction) * growth(x, direction)


def growth(x: float, direction: str) -> float:
    """g(x) of the module docstring for `direction` (one of DIRECTIONS): 0 inside the data, 1 + G·x beyond it."""
    return 0.0 if x <= 0 else 1.0 + GROWTH[direction] * x


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
             "size": SIZE_MULTIPLIER * unit(scale["size"], x["params"], "size"),
             "tokens_per_param": TPP_MULTIPLIER * unit(scale["tokens_per_param"], x["tokens_per_param"],
                                                       "tokens_per_param")}
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
              "scales_log": {d: scale[d] for d in DIRECTIONS}, "growth_per_efold": dict(GROWTH),
              "calibrated": bool(calibrated and ci.exists), "source": source,
              "method": "ln L ± sqrt((t·σ)² + (m_N·s_N·g_N(x_N))² + (m_M·s_M·g_M(x_M))²), g_N(x) = 1 + "
                        f"{GROWTH['size']:g}·x, g_M(x) = 1 + {GROWTH['tokens_per_param']:g}·x beyond the data; "
                        f"s = {SCALE_REF:g}·(b / {SCALE_REF:g})^w, w_N = {SCALE_POWER['size']:g}, w_M = "
                        f"{SCALE_POWER['tokens_per_param']:g}, b the form's backtest median |error| per direction; "
                        "m calibrated out of sample on published hold-outs (point_interval.CALIBRATION)"}
    return ci, record
