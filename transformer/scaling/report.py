"""The whole fit as one call: load points, fit the three approaches, write fit.json and the figures.

`experiments/fit.py` and the sweep runner (at the end of a sweep) both call `run_fit`.
"""
from __future__ import annotations

import os
from typing import Any

from transformer import files
from transformer.scaling import fits, plots
from transformer.scaling import points as points_lib


def run_fit(
    points_source: str | points_lib.Points,
    out_dir: str,
    *,
    n_kind: str = "params",
    drop_highest: int = 0,
    bootstrap: int = 0,
    seed: int = 0,
    isoflop_window: int | None = None,
    make_plots: bool = True,
) -> dict[str, Any]:
    """Fit the points (a CSV path, a sweep directory or `Points`) and write `out_dir/fit.json` + PNGs.

    Everything is validated and fitted before `out_dir` is created, so a bad input writes nothing.
    Returns the fit.json content.
    """
    if isinstance(points_source, points_lib.Points):
        pts = points_source
    else:
        pts = points_lib.load(str(points_source), n_kind=n_kind)
    fit = fits.fit_all(pts, drop_highest=drop_highest, bootstrap=bootstrap, seed=seed,
                       isoflop_window=isoflop_window)
    fit["n_kind"] = n_kind
    os.makedirs(out_dir, exist_ok=True)
    files.write_json(os.path.join(out_dir, "fit.json"), fit, indent=1, allow_nan=False)
    if make_plots:
        fit_figures = plots.write_all(fit, out_dir)
        fit["figures"] = [os.path.basename(p) for p in fit_figures]
    return fit


def _ci(res: dict[str, Any], key: str) -> str:
    interval = res.get(f"{key}_ci95")
    return f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else ""


def summary(fit: dict[str, Any]) -> str:
    """A few lines for people: a and b per approach (with 95% intervals), and E, α, β."""
    excluded = len(fit["points_excluded"])
    lines = [f"{len(fit['points'])} points used, {excluded} excluded (source: {fit['source']})"]
    for name in ("approach1", "approach2", "approach3"):
        res = fit[name]
        if res.get("a") is None:
            lines.append(f"{name}: not fitted: {res.get('note', 'no result')}")
            continue
        line = f"{name}: a = {res['a']:.3f}{_ci(res, 'a')}  b = {res['b']:.3f}{_ci(res, 'b')}"
        if name == "approach2":
            line += f"  ({len(res['budgets'])} budgets, {len(res['budgets_excluded'])} left out)"
        lines.append(line)
    a3 = fit["approach3"]
    if a3.get("E") is not None:
        lines.append(
            f"approach3: E = {a3['E']:.3f}{_ci(a3, 'E')}  A = {a3['A']:.4g}  B = {a3['B']:.4g}  "
            f"alpha = {a3['alpha']:.3f}{_ci(a3, 'alpha')}  beta = {a3['beta']:.3f}{_ci(a3, 'beta')}"
        )
    return "\n".join(lines)
