"""Size hold-outs of the loss at any (N, D) (`at_points`) on published grids, for `experiments.reproduce`.

Each set is refitted (`fits.fit_all(..., predict_points=...)`, approach 3 on all points: `approach3_near=0`) on the
points of the model sizes ≤ N_max/2 ("2x") and ≤ N_max/4 ("4x"), N_max its largest size, and predicts every
held-out point of the larger sizes. A point's score is |ln(L̂/L)| / (t·σ), the error in units of its interval's
half-width at multiplier 1. The points of one set share one fit, so their errors are correlated: a (set, case)
contributes one score to the conformal quantile, the SUMMARY-quantile of its points' scores (module constant and
docs/fitting.md "Loss at any (N, D)" for why).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from transformer.scaling import at_points, backtest, fits
from transformer.scaling import points as points_lib

CASES = (("2x", 2.0), ("4x", 4.0))
SUMMARY = 0.9  # a (set, case)'s score: this quantile of its held-out points' scores (see docs/fitting.md)


def size_holdout(name: str, pts: points_lib.Points, samples: int) -> list[dict[str, Any]]:
    """One record per case of `name`: {"data", "case", "held_sizes", "points": [{"params", "tokens", "truth",
    "predicted", "ci95", "error", "unit", "score"}], "score" (the summary), "chosen"} or {"data", "case", "note"}."""
    sizes_S = np.unique(pts.params_P)
    out = []
    for label, factor in CASES:
        train_P = pts.params_P <= sizes_S[-1] / factor * 1.0001
        rec: dict[str, Any] = {"data": name, "case": label}
        if len(np.unique(pts.params_P[train_P])) < at_points.MIN_SIZES or train_P.sum() < 5:
            out.append({**rec, "note": f"{len(np.unique(pts.params_P[train_P]))} sizes, {int(train_P.sum())} "
                                       f"points ≤ N_max/{factor:g}: too few to fit"})
            continue
        held = np.flatnonzero(~train_P)
        asked = [(float(pts.params_P[i]), float(pts.tokens_P[i])) for i in held]
        fit = fits.fit_all(pts.subset(train_P), bootstrap=samples, approach3_near=0, predict_points=asked)
        got = fit["point_predictions"]
        if "predictions" not in got:
            out.append({**rec, "note": got.get("note", "no prediction")})
            continue
        rows = []
        for i, p in zip(held, got["predictions"]):
            cal, truth = p["loss_interval"], float(pts.loss_P[i])
            unit = cal["t"] * (cal["sigma_log"] or 0.0)
            if not unit > 0:
                continue
            rows.append({"params": p["params"], "tokens": p["tokens"], "truth": truth, "predicted": p["loss"],
                         "ci95": p["loss_ci95"], "error": p["loss"] / truth - 1, "unit": unit,
                         "score": abs(np.log(p["loss"] / truth)) / unit})
        if not rows:
            out.append({**rec, "note": "no held-out point has an interval"})
            continue
        out.append({**rec, "points": rows, "chosen": got["chosen"], "held_sizes": len(np.unique(pts.params_P[held])),
                    "extrapolation": float(sizes_S[-1] / pts.params_P[train_P].max()),
                    "score": float(np.quantile([r["score"] for r in rows], SUMMARY))})
    return out


def calibrate(cases: list[dict[str, Any]], shipped: float) -> float:
    """Adds to each case with points its out-of-sample multiplier `m_out` (`backtest.leave_group_out` by
    "source"), and per point `covered_m1`, `covered`, `covered_out` and the widths `width_m1`, `width`,
    `width_out` at m = 1, the `shipped` m and m_out; returns the conformal m over the cases' summary scores."""
    sel = [c for c in cases if "points" in c]
    scores = [c["score"] for c in sel]
    for c, m_out in zip(sel, backtest.leave_group_out(scores, [c["source"] for c in sel])):
        c.update(m_out=m_out, m_shipped=shipped)
        for p in c["points"]:
            for key, m in (("_m1", 1.0), ("", shipped), ("_out", m_out)):
                p["covered" + key], p["width" + key] = backtest.at_multiplier(p["score"], p["unit"], m)
    return backtest.conformal_multiplier(scores)


def table(cases: list[dict[str, Any]]) -> list[str]:
    """Per group and case (Markdown): sets, held-out points, the share of points covered (each set weighted
    equally) at m = 1 → shipped m → out of sample, the sets whose SUMMARY-quantile is covered, median |error|
    and median width over the points."""
    keys = ("_m1", "", "_out")
    lines = ["| data | case | sets | points | 95% covers (points, sets weighted equally): m = 1 → shipped m → out of "
             "sample | sets covered (summary score): m = 1 → shipped → out | median abs error | median width: m = 1 "
             "→ shipped m → out of sample |", "|---|---|---|---|---|---|---|---|"]
    for group in dict.fromkeys(c["group"] for c in cases):
        for case, _ in CASES:
            sel = [c for c in cases if c["group"] == group and c["case"] == case and "points" in c]
            if not sel:
                continue
            pts = [p for c in sel for p in c["points"]]
            cover = " → ".join(f"{100 * np.mean([np.mean([p['covered' + k] for p in c['points']]) for c in sel]):.1f}%"
                               for k in keys)
            whole = " → ".join(f"{sum(c['score'] <= m for c, m in zip(sel, ms))}/{len(sel)}" for ms in (
                [1.0] * len(sel), [c["m_shipped"] for c in sel], [c["m_out"] for c in sel]))
            width = " → ".join(f"{100 * np.median([p['width' + k] for p in pts]):.2f}%" for k in keys)
            error = 100 * np.median(np.abs([p["error"] for p in pts]))
            lines.append(f"| {group} | {case} | {len(sel)} | {len(pts)} | {cover} | {whole} | {error:.2f}% | {width} |")
    return lines
