"""One definition of a 95% interval: its ends, the loss noise it was drawn from, and the multiplier of its width.

Legend: K = noise draws.

Every 95% interval under scaling/ is an `Interval` (fit.json, predictions.json, compare.json write its ends as
`KEY_ci95: [lo, hi]` and its source as `KEY_ci95_source`, `Interval.fields`). Two kinds are made:
- percentiles of K noise draws (`from_draws`; multiplier 1): the losses redrawn with the noise σ of
  `noise.estimate` and everything refitted (the exponents, the frontier, a compute multiplier);
- L̂·exp(±h) around a prediction, h the root sum of squares of a noise term and extrapolation terms that grow with
  the distance beyond the data, calibrated on published hold-outs: the frontier's (`backtest.frontier_interval`),
  the allocation's (`allocation.interval_at`, both through `backtest.log_interval`) and the loss at any (N, D)'s
  (`point_interval.interval`).

Its `source` names where the noise came from (SOURCES), "+"-joined where two fits' draws are paired (compare):
- "seeds": σ from seed replicates (points of equal budget and N);
- "residuals": σ from the scatter of ln L about a local cubic per budget (no replicates);
- "fit_residuals": no loss-noise estimate (no replicates, no budget of 4 or more sizes, the normal case of an
  over-training grid): the fitted form's own log residual RMS stands in for it (the scatter of one point about
  the form: an upper bound on the noise of the fitted curve, so the interval errs wide), where the form has
  residual degrees of freedom (more points than parameters);
- "none": no noise term at all: an interval that would have zero width is null with a note, one beyond the
  data holds the extrapolation misfit alone and says so.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

COVERAGE = 0.95
PERCENTILES = (2.5, 97.5)  # the 95% interval's ends
# Where a percentile of K draws falls: at rank q·(K + 1) among them (numpy's "weibull"), so that a new draw of the same
# distribution falls between the two ends with probability 95% whatever K (numpy's default, rank q·(K − 1) + 1,
# gives 90.4% at K = 40, 91.4% at 50 and 94.0% at 200). Fewer than 39 draws cannot reach 95%: the ends are the extremes.
PERCENTILE_METHOD = "weibull"
SOURCES = {
    "seeds": "loss noise σ from seed replicates",
    "residuals": "loss noise σ from the residuals of ln L about a local cubic per budget",
    "fit_residuals": "no loss-noise estimate: the fitted form's log residual RMS stands in for σ",
    "none": "no noise estimate",
}
NO_NOISE = "no loss-noise estimate and no residual degrees of freedom"


@dataclasses.dataclass(frozen=True)
class Interval:
    """A 95% interval [lo, hi] (None: an end that does not exist; +inf: an infinite one), the noise it was drawn
    from (`source`, module docstring) and the multiplier m of its half-width (1 for percentiles of draws);
    `note`: why it is null or what it lacks."""

    lo: float | None
    hi: float | None
    source: str
    multiplier: float = 1.0
    note: str | None = None

    def __post_init__(self) -> None:
        if not all(part in SOURCES for part in self.source.split("+")):
            raise ValueError(f"interval source {self.source!r}: each '+'-joined part must be one of {list(SOURCES)}")
        if not self.multiplier > 0:
            raise ValueError(f"interval multiplier {self.multiplier}: must be positive")
        if (self.lo is None) != (self.hi is None):
            raise ValueError("an interval has both ends or neither")
        if self.lo is not None and not self.lo <= self.hi:
            raise ValueError(f"interval [{self.lo}, {self.hi}]: lo must not exceed hi")

    @property
    def exists(self) -> bool:
        return self.lo is not None

    def to_json(self) -> list[float | None] | None:
        """[lo, hi] with an infinite end as null; None where there is no interval."""
        if not self.exists:
            return None
        return [None if not math.isfinite(x) else float(x) for x in (self.lo, self.hi)]

    def fields(self, key: str) -> dict[str, Any]:
        """The JSON keys of this interval for quantity `key`: KEY_ci95, KEY_ci95_source (and KEY_ci95_note)."""
        out: dict[str, Any] = {f"{key}_ci95": self.to_json(), f"{key}_ci95_source": self.source}
        if self.note:
            out[f"{key}_ci95_note"] = self.note
        return out


def none(note: str, multiplier: float = 1.0) -> Interval:
    """No interval, with the reason."""
    return Interval(None, None, "none", multiplier, note)


def noise_kind(noise: dict[str, Any]) -> str:
    """The source of `noise.estimate`'s σ: "seeds", "residuals" or "none"."""
    return noise.get("kind") or ("none" if not noise.get("sigma") else
                                 "seeds" if str(noise.get("source", "")).startswith("seed") else "residuals")


def percentile_ends(values_K: Sequence[float] | np.ndarray, keep_infinite: bool = False) -> tuple[float, float] | None:
    """The 2.5th and 97.5th percentiles of K draws (PERCENTILE_METHOD: at ranks 0.025·(K + 1) and 0.975·(K + 1),
    linear between order statistics); failed draws (NaN, None) are left out, and so are infinite ones unless
    `keep_infinite` (then an end that falls among the +inf draws is +inf). None with fewer than 2 draws left."""
    v = np.array([np.nan if x is None else x for x in np.asarray(values_K, object).ravel()], float)
    v = np.sort(v[~np.isnan(v) if keep_infinite else np.isfinite(v)])
    if len(v) < 2:
        return None
    ends = []
    for q in PERCENTILES:
        h = min(max(q / 100 * (len(v) + 1) - 1, 0.0), len(v) - 1.0)  # the 0-based rank
        lo, hi = int(math.floor(h)), int(math.ceil(h))
        ends.append(math.inf if np.isinf(v[hi]) else float(v[lo] + (h - lo) * (v[hi] - v[lo])))
    return ends[0], ends[1]


def from_draws(values_K: Sequence[float] | np.ndarray, source: str, keep_infinite: bool = False) -> Interval | None:
    """The 95% interval of K noise draws from the loss noise `source` (`percentile_ends`); None with fewer than 2
    usable draws."""
    ends = percentile_ends(values_K, keep_infinite)
    return None if ends is None else Interval(*ends, source)


def draw_lists(draws: dict[str, np.ndarray], keys: Sequence[str] | None = None) -> dict[str, list]:
    """Noise draws as JSON lists; a failed draw (NaN or ±inf) is null, and plots and intervals skip it."""
    return {k: [float(x) if np.isfinite(x) else None for x in np.asarray(draws[k], float)]
            for k in (keys or draws)}


def read_draws(stored: dict[str, list] | None, keys: Sequence[str]) -> dict[str, np.ndarray] | None:
    """`draw_lists` read back: each of `keys` as an array (K,), a null (failed) draw NaN; None without draws."""
    if not stored:
        return None
    return {k: np.array([np.nan if x is None else x for x in stored[k]], float) for k in keys}


def draws_or_point(result: dict[str, Any], keys: Sequence[str], samples: int) -> dict[str, np.ndarray]:
    """A fitted result's `samples` noise draws of `keys` (its "bootstrap" "draws"), (K,) each: a draw that failed
    in any of them takes the point values `result[key]`, and so do all K where it has no draws of that count (as
    when `predict` fits approach 3 without draws)."""
    stored = result.get("bootstrap", {}).get("draws") or {}
    point = {k: float(result[k]) for k in keys}
    if not all(len(stored.get(k, ())) == samples for k in keys):
        return {k: np.full(samples, v) for k, v in point.items()}
    draws = read_draws(stored, keys)
    ok_K = np.all([np.isfinite(draws[k]) for k in keys], axis=0)
    return {k: np.where(ok_K, draws[k], point[k]) for k in keys}


def of_draws(draws: dict[str, np.ndarray], keys: Sequence[str], source: str) -> dict[str, Any]:
    """KEY_ci95 for each of `keys` with 2 or more usable draws, and their common `ci95_source`."""
    out: dict[str, Any] = {}
    for k in keys:
        ci = from_draws(draws[k], source)
        if ci is not None:
            out[f"{k}_ci95"] = ci.to_json()
    if out:
        out["ci95_source"] = source
    return out


def residual_sd(rms: float | None, dof: int) -> float | None:
    """A fitted form's log residual RMS as the stand-in noise sd ("fit_residuals"): None without residual
    degrees of freedom (as many parameters as points: the RMS is ~0 by construction) or a positive value."""
    if rms is None or dof < 1 or not (np.isfinite(rms) and rms > 0):
        return None
    return float(rms)
