"""The whole fit as one call: load points, fit the three approaches, write fit.json and the figures.

`experiments/fit.py` and the sweep runner (at the end of a sweep) both call `run_fit`.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from transformer import environment, files
from transformer.scaling import fits, plots
from transformer.scaling import points as points_lib

DIRECTION_WORDS = {"size": "model size", "tokens_per_param": "tokens per parameter"}


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
    isoflop_method: str | None = None,
    headline: str | None = None,
    predict_flops: Sequence[float] = (),
    approach3_near: float = fits.APPROACH3_NEAR,
    annotate: dict[str, Any] | None = None,
    predict_points: Sequence[tuple[float, float]] = (),
) -> dict[str, Any]:
    """Fit the points (a CSV path, a sweep directory or `Points`) and write `out_dir/fit.json` + PNGs.

    The options are `fits.fit_all`'s; `annotate` adds keys to fit.json that the figures show (a sweep's
    `validation`: the measured point beside its prediction). Everything is validated and fitted before
    `out_dir` is created, so a bad input writes nothing. Returns the fit.json content.
    """
    if isinstance(points_source, points_lib.Points):
        pts = points_source
    else:
        pts = points_lib.load(str(points_source), n_kind=n_kind)
    fit = fits.fit_all(pts, drop_highest=drop_highest, bootstrap=bootstrap, seed=seed,
                       isoflop_window=isoflop_window, isoflop_method=isoflop_method, headline=headline,
                       predict_flops=predict_flops, approach3_near=approach3_near, predict_points=predict_points)
    fit["n_kind"] = n_kind
    fit["metric"] = pts.metric  # what "loss" is throughout: eval_loss, or experiments.fit --metric's
    fit["environment"] = environment.record()  # this fit's; each run's is in its summary.json
    if pts.environments:
        fit["run_environments"] = list(pts.environments)
        if len(pts.environments) > 1:
            fit["environment_warning"] = (f"the fitted runs were computed in {len(pts.environments)} environments "
                                          f"(run_environments): losses can differ between them by more than the "
                                          f"noise (docs/sweeps.md, 'Reproducing figures on another machine')")
    fit.update(annotate or {})
    os.makedirs(out_dir, exist_ok=True)
    files.write_json(os.path.join(out_dir, "fit.json"), fit, indent=1, allow_nan=False)
    if make_plots:
        fit_figures = plots.write_all(fit, out_dir)
        fit["figures"] = [os.path.basename(p) for p in fit_figures]
    return fit


def _ci(res: dict[str, Any], key: str, fmt: str = ".3f") -> str:
    interval = res.get(f"{key}_ci95")
    return f" [{interval[0]:{fmt}}, {interval[1]:{fmt}}]" if interval else ""


def summary(fit: dict[str, Any]) -> str:
    """A few lines for people: the headline convention, σ, a and b per approach (95% intervals), approach
    3's parameters and residuals, a and b under every convention, the frontier and predictions."""
    excluded = len(fit["points_excluded"])
    head = fit["headline"]
    lines = [f"{len(fit['points'])} points used, {excluded} excluded (source: {fit['source']})",
             f"headline convention: {head['convention']}: {head['definition']} ({head['why']})"]
    lines.extend(f"input: {note}" for note in fit.get("input_notes", []))
    if fit.get("environment_warning"):
        lines.append(f"WARNING: {fit['environment_warning']}")
    unpadded = fit["conventions"].get("unpadded")
    if unpadded and head["convention"] != "unpadded":  # the padded vocabulary's rows tilt a count of total N
        c2, a2 = unpadded["approach2"], fit["approach2"]
        lines.append("beside the headline: N without the vocabulary's padding rows (convention unpadded): approach2 "
                     + (f"a = {c2['a']:.3f}{_ci(c2, 'a')}" if c2.get("a") is not None else "a = n/a")
                     + (f" (headline a = {a2['a']:.3f})" if a2.get("a") is not None else ""))
    share, non_emb = fit.get("non_embedding_share"), fit["conventions"].get("non_embedding")
    if share and non_emb and head["convention"] != "non_embedding" and share["max"] - share["min"] > 0.1:
        c2, a2 = non_emb["approach2"], fit["approach2"]  # embeddings weigh differently across the sizes
        lines.append(f"beside the headline: the share of N outside the embeddings varies from {share['min']:.0%} "
                     f"to {share['max']:.0%} across the points; non-embedding N (convention non_embedding): "
                     + (f"approach2 a = {c2['a']:.3f}{_ci(c2, 'a')}" if c2.get("a") is not None else "approach2 a = n/a")
                     + (f" (headline a = {a2['a']:.3f})" if a2.get("a") is not None else ""))
    sigma = fit["noise"]
    lines.append(f"loss noise: sigma = {sigma['sigma']:.4f} in ln L from {sigma['source']}" if sigma["sigma"]
                 else f"loss noise: {sigma['source']}: no intervals")
    for name in ("approach1", "approach2", "approach3"):
        res = fit[name]
        if res.get("a") is None:
            lines.append(f"{name}: not fitted: {res.get('note', 'no result')}")
            continue
        line = f"{name}: a = {res['a']:.3f}{_ci(res, 'a')}  b = {res['b']:.3f}{_ci(res, 'b')}"
        if name == "approach2":
            line += (f"  ({res['method']}; {len(res['budgets'])} budgets, "
                     f"{len(res['budgets_excluded'])} left out)")
        lines.append(line)
    a3 = fit["approach3"]
    if a3.get("E") is not None:
        lines.append(
            f"approach3: E = {a3['E']:.3f}{_ci(a3, 'E')}  A = {a3['A']:.4g}  B = {a3['B']:.4g}  "
            f"alpha = {a3['alpha']:.3f}{_ci(a3, 'alpha')}  beta = {a3['beta']:.3f}{_ci(a3, 'beta')}"
        )
        lines.append(f"approach3 fits {a3['selection']}: {len(a3['points_used'])} points, log residual RMS "
                     f"{a3['residual_rms']:.4f}, max {a3['residual_max']:.4f}"
                     + (f", {len(a3['beyond_noise'])} beyond 3 sigma" if "beyond_noise" in a3 else ""))
        if a3.get("warning"):
            lines.append(f"approach3 WARNING: {a3['warning']}")
    for name, conv in fit["conventions"].items():
        c2, c3 = conv["approach2"], conv["approach3"]
        a2_text = f"a = {c2['a']:.3f}{_ci(c2, 'a')}" if c2.get("a") is not None else "a = n/a"
        a3_text = f"{c3['a']:.3f}" if c3.get("a") is not None else "n/a"
        lines.append(f"  convention {name:17s} approach2 {a2_text}  approach3 a = {a3_text}")
    law = fit["frontier"].get("law")
    if law:
        lines.append(f"frontier: L_opt(C) = {law['E']:.3f} + {law['k']:.4g}·C^-{law['gamma']:.3f}"
                     f"{_ci(fit['frontier'], 'gamma')} (E from {_e_words(fit['frontier'])})")
    if fit["frontier"].get("warning"):
        lines.append(f"frontier WARNING: {fit['frontier']['warning']}")
    lines.extend(backtest_table(fit["frontier"].get("backtest")))
    lines.extend(sensitivity_lines(fit["frontier"].get("sensitivity")))
    for p in fit.get("predictions", []):
        lines.append(f"prediction at C = {p['flops']:.3g}: N_opt {p.get('params', float('nan')):.4g}"
                     f"{_ci(p, 'params', '.4g')}  D_opt {p.get('tokens', float('nan')):.4g}"
                     f"{_ci(p, 'tokens', '.4g')}  loss "
                     + (f"{p['loss']:.4f}{_ci(p, 'loss', '.4f')}" if p.get("loss") is not None else "n/a")
                     + (f" ({_noise_only_words(p)}; " + _interval_words(p) + ")" if p.get("loss_interval") else ""))
        if (p.get("params_interval") or {}).get("half_width_log"):
            lines.append("  N_opt, D_opt intervals: " + allocation_words(p["params_interval"]))
    at = fit.get("point_predictions")
    if at and at.get("predictions"):
        lines += points_lines(at)
    elif at:
        lines.append(f"loss at (N, D): {at.get('note')}")
    return "\n".join(lines)


def allocation_words(cal: dict[str, Any]) -> str:
    """What sets the N_opt interval (`allocation.interval_at`'s terms; D_opt's has the same form)."""
    noise = "NO noise term" if cal["source"] == "none" else (
        f"noise ({cal['source']}) ±{100 * cal['noise_half_width_log']:.1f}%")
    return (f"{noise}, scatter of the minima ±{100 * cal['scatter_half_width_log']:.1f}% = q {cal['spread']:g} × "
            f"σ {100 * cal['scatter_sd_log']:.1f}% ({cal['scatter_from']}) × leverage {cal['leverage']:.2f} (q "
            "calibrated on published sets)")


def _e_words(front: dict[str, Any]) -> str:
    """Where the frontier's E came from, and the test that decided it."""
    test = front.get("test")
    if isinstance(test, dict):
        verdict = "≤" if front["E_from"] == "approach 3" else ">"
        text = (f"{front['E_from']}: χ² {test['statistic']:.2f} {verdict} {test['threshold']:.2f}, approach 3's E "
                f"{test['E_approach3']:.3f} vs the minima's {test['E_free']:.3f}")
        w = (front.get("law") or {}).get("weight_held")
        if w is not None:
            text += f"; predictions average the held-E law (weight {w:.2f}) and the free one ({1 - w:.2f})"
        return text
    return front["E_from"] + (f": {test}" if test else "")

def points_lines(at: dict[str, Any]) -> list[str]:
    """The loss at (N, D) on the console: the form and why (both forms' backtest errors in both directions), what
    sets the intervals, and each prediction with its distances beyond the data and its largest term."""
    pct = lambda v: "n/a" if v is None else f"{100 * v:.2f}%"
    cand = at["candidates"]
    lines = [f"loss at (N, D) from {at['chosen']}: {at['form']} (chosen by the backtests, median |error| by model "
             "size / by tokens per parameter: " + ", ".join(
                 f"{name} {pct(c['backtest_size']['median_abs_error'])} / "
                 f"{pct(c['backtest_tokens_per_param']['median_abs_error'])}" for name, c in cand.items()) + ")"]
    iv = at["interval"]
    g = iv["growth_per_efold"]  # per direction
    lines.append(f"interval: noise {pct(iv['noise_sd_log'])} (the fit's residual RMS); beyond the data "
                 + " and ".join(f"{iv['multipliers'][d]:g} × {pct(iv['effective_scales_log'][d])}"
                                + (f" (from the backtest's {pct(iv['scales_log'][d])})"
                                   if iv["scale_power"][d] != 1 else "")
                                + f" × (1 + {g[d]:g}·x) in {DIRECTION_WORDS[d]}"
                                for d in ("size", "tokens_per_param"))
                 + ", x the e-folds beyond the data (calibrated out of sample on published hold-outs)")
    if at.get("warning"):
        lines.append(f"{at['chosen']} WARNING (applies to these losses): {at['warning']}")
    if at.get("note"):
        lines.append(f"note: {at['note']}")
    for p in at["predictions"]:
        x = p["loss_interval"]["distances"]
        where = (f"{x['params']:.2f} e-folds beyond the largest model, {x['tokens_per_param']:.2f} beyond the most "
                 f"tokens per parameter, {x['compute']:.2f} in compute; width from {p['loss_interval']['driven_by']}"
                 if p["loss_interval"]["half_width_log"] > 0 else "")
        lines.append(f"loss at N = {p['params']:.4g}, D = {p['tokens']:.4g}: {p['loss']:.4f}{_ci(p, 'loss', '.4f')}"
                     f" ({where + '; ' if where else ''}{_interval_words(p)})")
    return lines


def _noise_only_words(p: dict[str, Any]) -> str:
    """The noise-only loss interval at C; beyond the data, where it is wider than the 95% interval, why (the
    interval's noise term is taken where the data end: the noise's effect on the extrapolation is part of the
    calibrated term, docs/fitting.md)."""
    text = f"noise only {_ci(p, 'loss_noise', '.4f').strip() or 'n/a'}"
    lo, hi = p.get("loss_ci95") or (None, None)
    nlo, nhi = p.get("loss_noise_ci95") or (None, None)
    beyond = (p.get("loss_interval") or {}).get("distance", 0) > 0
    if beyond and None not in (lo, hi, nlo, nhi) and nhi - nlo > hi - lo:
        text += (", at C: wider than the interval, whose noise term is the noise where the data end (beyond them the "
                 "noise's effect on the extrapolation is part of the calibrated term)")
    return text


def _interval_words(p: dict[str, Any]) -> str:
    """How a prediction's loss interval was made: its noise source, the calibration, or why there is none."""
    if not p.get("loss_ci95"):
        return f"no interval: {p.get('loss_ci95_note', 'no noise estimate')}"
    cal = p["loss_interval"]
    if "spread" in cal:  # the frontier's: a noise term and an extrapolation term
        edge = " at the largest budget" if cal["distance"] > 0 and cal.get("noise_at_flops") else ""
        noise = "NO noise term" if cal["source"] == "none" else (
            f"noise ({cal['source']}){edge} ±{100 * cal['noise_half_width_log']:.2f}%")
        terms = {"noise": cal["noise_half_width_log"], "extrapolation": cal["extrapolation_half_width_log"]}
        larger = max(terms, key=terms.get)
        sets = f"; the {larger} term sets the width" if cal.get("half_width_log") == terms[larger] else ""
        gamma = cal.get("gamma")
        steep = f"·γ^{cal['gamma_power']:g}" if gamma is not None else ""
        return (f"{noise}, extrapolation ±{100 * cal['extrapolation_half_width_log']:.2f}% = q {cal['spread']:g} × "
                f"x{steep}/span^{cal.get('span_power', 1):g} {cal['lever']:.3f} (x = {cal['distance']:.2f} e-folds "
                f"beyond the largest budget, " + (f"the law's γ {gamma:.3f}, " if gamma is not None else "")
                + f"the minima span {cal['span']:.2f}; q calibrated on published sets{sets})")
    noise = {"fit_residuals": "the fit's residual RMS as noise"}.get(cal.get("source", ""), f"noise: {cal.get('source')}")
    if cal.get("source") == "none":
        noise = "NO noise term: the extrapolation misfit alone"
    if "multipliers" in cal:  # the loss at (N, D) (`point_interval`)
        inside = cal["distance"] <= 0
        return noise + ("; inside the data" if inside else "; calibrated" if cal["calibrated"] else
                        "; NOT calibrated: no backtest pair, the residual RMS stands in")
    return noise + "; " + (f"calibrated on the backtest, m = {cal.get('multiplier', 1.0):g}" if cal["calibrated"]
                           else "NOT calibrated: no backtest refit, the misfit prior alone")


def backtest_table(bt: dict[str, Any] | None) -> list[str]:
    """The frontier's backtest as console lines: per refit (first k budgets), the error at each later budget."""
    if not bt or not bt.get("pairs"):
        return ["backtest: fewer than 4 budget minima: none"] if bt else []
    lines = [f"backtest (refit on the first k budget minima, predict each later one): median |error| "
             f"{100 * bt['median_abs_error']:.2f}%, max {100 * bt['max_abs_error']:.2f}%; RMS "
             f"{100 * bt['misfit_per_efold']:.2f}% per e-fold of extrapolation ({bt['misfit_pairs']} pairs from "
             f"{bt['misfit_origins']} refits on ≥ {bt['misfit_min_origin']} budgets, with the prior)",
             "   k  fitted to C      predicts C   x(C/C_k)  predicted  measured  error"]
    for p in bt["pairs"]:
        lines.append(f"  {p['k']:2d}  {p['fit_flops']:10.3g}  {p['flops']:10.3g}  {np.exp(p['distance']):8.2f}  "
                     f"{p['predicted']:9.4f}  {p['measured']:8.4f}  {100 * (np.exp(p['log_error']) - 1):+.2f}%")
    return lines


def sensitivity_lines(sens: dict[str, Any] | None) -> list[str]:
    """The frontier forecast's leave-one-budget-out stability as console lines, one per prediction budget."""
    if not sens:
        return []
    lines = []
    for q, c in enumerate(sens["at_flops"]):
        line = (f"leave one budget out ({len(sens['dropped'])} budgets): the forecast at C = {c:.3g}"
                + (" (4x the largest budget)" if sens.get("reference") else "") + " moves: loss max "
                f"{100 * sens['loss_max_abs_change'][q]:.2f}%, mean {100 * sens['loss_mean_abs_change'][q]:.2f}%")
        if "params_max_abs_change" in sens:
            rule = sens.get("allocation_rule", "approach 2")  # (fit.json written before it was recorded: approach 2)
            line += (f"; N_opt ({rule}) max {100 * sens['params_max_abs_change'][q]:.1f}%, "
                     f"mean {100 * sens['params_mean_abs_change'][q]:.1f}%")
        lines.append(line)
    return lines
