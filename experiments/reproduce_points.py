"""Hold-outs of the loss at any (N, D) (`at_points`) on published grids and the CPU over-training ladder, for
`experiments.reproduce`: the calibration of `point_interval`'s multipliers and its out-of-sample check.

Each set is refitted (`fits.fit_all(..., predict_points=...)` with the default `approach3_near`: the predictor a
user gets, both forms fitted to the points approach 3 keeps and chosen by their backtests) on part of its points
and predicts every other point, in two regimes:
- by size: the points of the model sizes ≤ N_max/2 ("size 2x") and ≤ N_max/4 ("size 4x"), N_max the set's largest;
- by tokens per parameter: the points at ≤ 10 ("tpp ≤ 10") and ≤ 40 ("tpp ≤ 40") tokens per parameter.
Held out are the other points trained on at least MIN_TOKENS_PER_PARAM tokens per parameter: IsoFLOP grids reach
down to 0.01 (a 1B model on 10M tokens), which no one trains and which approach 3's default fit (the points near
each budget's optimum) does not describe; below the fitted range the interval has the same term as above it, not
calibrated there (docs/fitting.md).
A held-out point of a hold-out by size has the score m_N its size term needs to reach its error e = ln(L̂/L) beside
the noise term and the tokens-per-parameter term at the current m_M: sqrt(max(e² − (t·σ)² − (m_M·u_M)², 0)) / u_N,
u = s(b)·g(x) (`point_interval.unit`); a point of a hold-out by tokens per parameter likewise gives m_M. The points of one
hold-out share one fit and their errors move together, so each (set, hold-out) weighs the same: a multiplier is the
`point_interval.COVERAGE` split-conformal quantile (`backtest.conformal_multiplier`) of its regime's scores with
each point weighted 1 / (its hold-out's points), the two found in turn until they settle (`multipliers`). Out of sample (`calibrate`), each data source's hold-outs
get the multipliers of the other sources'.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from transformer.scaling import at_points, backtest, fits, point_interval
from transformer.scaling import points as points_lib

CASES = (("size 2x", "size", 2.0), ("size 4x", "size", 4.0),
         ("tpp ≤ 10", "tokens_per_param", 10.0), ("tpp ≤ 40", "tokens_per_param", 40.0))
SHIPPED = {"size": point_interval.SIZE_MULTIPLIER, "tokens_per_param": point_interval.TPP_MULTIPLIER}
MIN_TOKENS_PER_PARAM = 1.0
REGIMES = {"size": "params", "tokens_per_param": "tokens_per_param"}  # a regime's direction → its distance key


def train_mask(pts: points_lib.Points, regime: str, value: float) -> np.ndarray:
    """The points a hold-out refits on (module docstring)."""
    if regime == "size":
        return pts.params_P <= np.unique(pts.params_P)[-1] / value * 1.0001
    return pts.tokens_P / pts.params_P <= value * 1.0001


def holdout(name: str, pts: points_lib.Points) -> list[dict[str, Any]]:
    """One record per case of `name`: {"data", "case", "regime", "chosen", "points": [{"params", "tokens", "truth",
    "predicted", "log_error", "distances", "noise", "unit": {direction: s(b)·g(x)}}], "scales_log": the fit's b per
    direction} or {"data", "case", "regime", "note"}."""
    out = []
    for label, regime, value in CASES:
        train_P = train_mask(pts, regime, value)
        rec: dict[str, Any] = {"data": name, "case": label, "regime": regime}
        sizes = len(np.unique(pts.params_P[train_P]))
        if sizes < at_points.MIN_SIZES or train_P.sum() < 5 or train_P.all():
            out.append({**rec, "note": f"{sizes} sizes, {int(train_P.sum())} of {len(pts)} points kept: "
                                       + ("nothing held out" if train_P.all() else "too few to fit")})
            continue
        held = np.flatnonzero(~train_P & (pts.tokens_P / pts.params_P >= MIN_TOKENS_PER_PARAM))
        if not len(held):
            out.append({**rec, "note": f"no point left out at ≥ {MIN_TOKENS_PER_PARAM:g} tokens per parameter"})
            continue
        got = fits.fit_all(pts.subset(train_P), approach3_near=fits.APPROACH3_NEAR, predict_points=[
            (float(pts.params_P[i]), float(pts.tokens_P[i])) for i in held])["point_predictions"]
        if "predictions" not in got:
            out.append({**rec, "note": got.get("note", "no prediction")})
            continue
        rows = []
        for i, p in zip(held, got["predictions"]):
            cal, truth = p["loss_interval"], float(pts.loss_P[i])
            unit = {d: point_interval.unit(cal["scales_log"][d], cal["distances"][REGIMES[d]], d) for d in REGIMES}
            rows.append({"params": p["params"], "tokens": p["tokens"], "truth": truth, "predicted": p["loss"],
                         "log_error": float(np.log(p["loss"] / truth)), "distances": cal["distances"],
                         "noise": cal["terms_log"]["noise"], "unit": unit})
        out.append({**rec, "points": rows, "chosen": got["chosen"], "held_sizes": len(np.unique(pts.params_P[held])),
                    "scales_log": got["interval"]["scales_log"]})
    return out


def half_width(p: dict[str, Any], m: dict[str, float]) -> float:
    """A point's interval half-width in ln L under the multipliers `m` (per direction)."""
    return float(np.sqrt(p["noise"] ** 2 + sum((m[d] * p["unit"][d]) ** 2 for d in REGIMES)))


def score(p: dict[str, Any], regime: str, m: dict[str, float]) -> float:
    """The multiplier `regime`'s term needs for the interval to reach the point's error, the other direction's term
    at its multiplier in `m` (0 where the rest covers it; inf where the point has no term in `regime`)."""
    rest = p["noise"] ** 2 + sum((m[d] * p["unit"][d]) ** 2 for d in REGIMES if d != regime)
    need = p["log_error"] ** 2 - rest
    if need <= 0:
        return 0.0
    return float(np.sqrt(need) / p["unit"][regime]) if p["unit"][regime] > 0 else float("inf")


def weighted_quantile(cases: list[dict[str, Any]], regime: str, m: dict[str, float],
                      level: float = point_interval.COVERAGE) -> float:
    """The `level` split-conformal quantile (`backtest.conformal_multiplier`, the one rule every calibrated
    interval uses) of the scores (`score`, the other multiplier at `m`) of `regime`'s hold-outs, each (set,
    hold-out) weighted equally; inf where there are none or too few for `level`."""
    values, weights = [], []
    for c in cases:
        if c["regime"] == regime and c.get("points"):
            values += [score(p, regime, m) for p in c["points"]]
            weights += [1.0 / len(c["points"])] * len(c["points"])
    return backtest.conformal_multiplier(values, level, weights) if values else float("inf")


def multipliers(cases: list[dict[str, Any]], rounds: int = 8) -> dict[str, float]:
    """Both directions' multipliers over `cases`, each the weighted quantile given the other, in turn."""
    m = {d: 0.0 for d in REGIMES}
    for _ in range(rounds):
        for d in REGIMES:
            m[d] = weighted_quantile(cases, d, m)
            m[d] = m[d] if np.isfinite(m[d]) else 0.0
    return m


def calibrate(cases: list[dict[str, Any]]) -> dict[str, float]:
    """The multipliers over every hold-out ({direction: m}); adds to each case with points `m_out` (the multipliers
    of the other data sources' hold-outs, by "source") and per point `covered`/`width` under the shipped
    multipliers and `covered_out`/`width_out` under m_out (width: (hi − lo) / L̂)."""
    sel = [c for c in cases if "points" in c]
    by_source: dict[str, dict[str, float]] = {}
    for c in sel:
        if c["source"] not in by_source:
            by_source[c["source"]] = multipliers([o for o in sel if o["source"] != c["source"]])
        c["m_out"] = by_source[c["source"]]
        for p in c["points"]:
            for key, m in (("", SHIPPED), ("_out", c["m_out"])):
                h = half_width(p, m)
                p["covered" + key] = bool(abs(p["log_error"]) <= h)
                p["width" + key] = float(2 * np.sinh(h))
    return multipliers(sel)


def table(cases: list[dict[str, Any]]) -> list[str]:
    """Per group and case (Markdown): sets, held-out points, the share of points covered (each set weighted
    equally) with the shipped multipliers and out of sample, median |error|, median width (both), and the width
    over the median |error|."""
    lines = ["| data | hold-out | sets | points | 95% covers (points, sets weighted equally): shipped m → out of "
             "sample | median abs error | median width: shipped m → out of sample | width / error (out of sample) |",
             "|---|---|---|---|---|---|---|---|"]
    for group in dict.fromkeys(c["group"] for c in cases):
        for label, _, _ in CASES:
            sel = [c for c in cases if c["group"] == group and c["case"] == label and "points" in c]
            if not sel:
                continue
            pts = [p for c in sel for p in c["points"]]
            cover = " → ".join(f"{100 * np.mean([np.mean([p['covered' + k] for p in c['points']]) for c in sel]):.1f}%"
                               for k in ("", "_out"))
            width = " → ".join(f"{100 * np.median([p['width' + k] for p in pts]):.2f}%" for k in ("", "_out"))
            error = np.median(np.abs([np.expm1(p["log_error"]) for p in pts]))
            ratio = np.median([p["width_out"] for p in pts]) / error
            lines.append(f"| {group} | {label} | {len(sel)} | {len(pts)} | {cover} | {100 * error:.2f}% | {width} "
                         f"| {ratio:.1f} |")
    return lines


def regime_table(cases: list[dict[str, Any]]) -> list[str]:
    """Per regime over every set (Markdown): coverage, median |error|, median width and their ratio out of sample."""
    lines = ["| regime | hold-outs | points | 95% covers out of sample (sets weighted equally) | median abs error "
             "| median width out of sample | width / error |", "|---|---|---|---|---|---|---|"]
    for regime in REGIMES:
        sel = [c for c in cases if c["regime"] == regime and "points" in c]
        pts = [p for c in sel for p in c["points"]]
        if not pts:
            continue
        cover = 100 * np.mean([np.mean([p["covered_out"] for p in c["points"]]) for c in sel])
        error = np.median(np.abs([np.expm1(p["log_error"]) for p in pts]))
        width = np.median([p["width_out"] for p in pts])
        lines.append(f"| by {regime.replace('_', ' ')} | {len(sel)} | {len(pts)} | {cover:.1f}% | {100 * error:.2f}% "
                     f"| {100 * width:.2f}% | {width / error:.1f} |")
    return lines


def family_split(cases: list[dict[str, Any]]) -> list[str]:
    """Leave one family out (Markdown): each family's hold-outs under the multipliers of the other families' (a
    harder split than one source out: a family's settings share a code base and data)."""
    sel = [c for c in cases if "points" in c]
    lines = ["| family left out | regime | multiplier from the others | 95% covers (sets weighted equally) | median "
             "width | median abs error |", "|---|---|---|---|---|---|"]
    for family in dict.fromkeys(c["family"] for c in sel):
        m = multipliers([c for c in sel if c["family"] != family])
        for regime in REGIMES:
            mine = [c for c in sel if c["family"] == family and c["regime"] == regime]
            if not mine:
                continue
            pts = [p for c in mine for p in c["points"]]
            cover = 100 * np.mean([np.mean([abs(p["log_error"]) <= half_width(p, m) for p in c["points"]])
                                   for c in mine])
            width = np.median([2 * np.sinh(half_width(p, m)) for p in pts])
            error = np.median(np.abs([np.expm1(p["log_error"]) for p in pts]))
            lines.append(f"| {family} | by {regime.replace('_', ' ')} | {m[regime]:.2f} | {cover:.1f}% | "
                         f"{100 * width:.2f}% | {100 * error:.2f}% |")
    return lines


# What each direction's term is tested against (docs/fitting.md): the distance beyond the data in e-folds, and in
# model size the backtest's error b (by tertile of the hold-outs).
DISTANCE_BINS = {"size": (0.0, 0.5, 1.0, 1.5, np.inf),
                 "tokens_per_param": (0.0, np.log(2), np.log(4), np.log(8), np.inf)}


def conditional_table(cases: list[dict[str, Any]]) -> list[str]:
    """Out-of-sample coverage (each hold-out weighted equally) and median width per bin of each direction's distance
    and, by size, per tertile of b (Markdown; after `calibrate`): a calibrated term covers about the same everywhere."""
    lines = ["| regime | bin | points | 95% covers out of sample | median width |", "|---|---|---|---|---|"]

    def row(regime: str, label: str, groups: list[list[dict[str, Any]]]) -> None:
        groups = [g for g in groups if g]
        pts = [p for g in groups for p in g]
        if pts:
            cover = 100 * np.mean([np.mean([p["covered_out"] for p in g]) for g in groups])
            lines.append(f"| by {regime.replace('_', ' ')} | {label} | {len(pts)} | {cover:.1f}% | "
                         f"{100 * np.median([p['width_out'] for p in pts]):.2f}% |")
    for regime, edges in DISTANCE_BINS.items():
        sel = [c for c in cases if c["regime"] == regime and "points" in c]
        for lo, hi in zip(edges[:-1], edges[1:]):
            row(regime, f"x in ({lo:.2f}, {hi:.2f}]",
                [[p for p in c["points"] if lo < p["distances"][REGIMES[regime]] <= hi] for c in sel])
    sel = [c for c in cases if c["regime"] == "size" and "points" in c]
    b_C = np.array([c["scales_log"]["size"] for c in sel])
    for third in np.array_split(np.argsort(b_C, kind="stable"), 3):
        if len(third):
            row("size", f"b in [{100 * b_C[third].min():.2f}%, {100 * b_C[third].max():.2f}%]",
                [sel[i]["points"] for i in third])
    return lines
