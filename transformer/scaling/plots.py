"""PNG figures of a scaling-law fit, drawn from the fit.json content (`fits.fit_all`'s dict).

Legend: G = points on a drawn line or grid axis.

Figures: IsoFLOP curves with their parabolas and minima; N_opt and D_opt against compute with the
three approaches' power laws (and bootstrap bands); the loss frontier against compute; Approach 3's
loss contours in (N, D) with the IsoFLOP lines and the compute-optimal line.
"""
from __future__ import annotations

import os
import textwrap
from typing import Any

import numpy as np
from matplotlib import colors, figure
from matplotlib.cm import ScalarMappable

from transformer.scaling import backtest, frontier, interval, parametric

LABEL_C = "compute C (FLOPs)"
LABEL_N = "parameters N"
LABEL_D = "tokens D"
LABEL_LOSS = "validation loss (nats/token)"


def loss_label(fit: dict[str, Any]) -> str:
    """The y label of what the fit fitted as its loss (fit.json's `metric`: eval_loss, or experiments.fit --metric's,
    a sweep's sweep.predict_metrics)."""
    metric = fit.get("metric", "eval_loss")
    if metric == "eval_loss":
        return LABEL_LOSS
    return f"{metric} ({'bits/byte' if metric.endswith('bits_per_byte') else 'nats/token'})"
APPROACH_STYLE = {
    "approach1": ("C0", ":", "1: loss envelope"),
    "approach2": ("C1", "--", "2: IsoFLOP minima"),
    "approach3": ("C2", "-", "3: parametric L(N, D)"),
}


def _points(fit: dict[str, Any]) -> dict[str, np.ndarray]:
    recs = fit["points"]
    return {k: np.array([r[k] for r in recs], dtype=float) for k in ("params", "tokens", "flops", "loss")}


def _flops_range(fit: dict[str, Any]) -> np.ndarray:
    """Compute values spanning the points, the envelope and predictions, a factor 2 beyond each end, (G,)."""
    flops = (list(_points(fit)["flops"]) + list(fit["approach1"].get("envelope", {}).get("flops", []))
             + [p["flops"] for p in fit.get("predictions", [])])
    return np.geomspace(min(flops) / 2, max(flops) * 2, 200)


def _flops_norm(fit: dict[str, Any]) -> colors.LogNorm:
    flops = _points(fit)["flops"]
    return colors.LogNorm(vmin=flops.min(), vmax=max(flops.max(), flops.min() * 1.01))


def _colorbar(fig: figure.Figure, ax: Any, norm: colors.Normalize, cmap: str = "viridis") -> None:
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label=LABEL_C)


def _note(ax: Any, text: str, y: float = 0.5, width: int = 60) -> None:
    """A message in the axes (what is not drawn, and why), centred at height `y` (axes fraction), its lines
    wrapped at `width` characters."""
    text = "\n".join(textwrap.fill(line, width) for line in text.split("\n"))
    ax.text(0.5, y, text, transform=ax.transAxes, ha="center", va="center", fontsize=7,
            bbox={"facecolor": "w", "alpha": 0.85, "edgecolor": "0.6"}, zorder=6)


def _log_scales(ax: Any, x: bool, y: bool, empty: str) -> bool:
    """Log scales on the axes asked for where something positive was drawn on them; else linear axes without
    ticks and the note `empty` (a log axis with no data cannot be drawn). Returns whether the data were there."""
    lim = ax.dataLim
    drawn = (not x or np.isfinite(lim.minposx)) and (not y or np.isfinite(lim.minposy))
    if drawn:
        ax.set(xscale="log" if x else ax.get_xscale(), yscale="log" if y else ax.get_yscale())
    else:
        ax.set(xticks=[], yticks=[])
        _note(ax, empty)
    return drawn


def _no_predictions(fit: dict[str, Any], key: str) -> str:
    """The "cannot predict" lines of fit["predictions"] whose `key` is null ("" when none)."""
    return "\n".join(f"no prediction at C = {p['flops']:.3g}: {p.get('note') or 'the fit cannot predict'}"
                      for p in fit.get("predictions", []) if p.get(key) is None)


def _save(fig: figure.Figure, path: str) -> str:
    fig.savefig(path, dpi=130)
    return path


DISCRETE_LEGEND_MAX = 6  # up to this many budgets get a legend entry each instead of a colour bar


def plot_isoflops(fit: dict[str, Any], path: str) -> str:
    """Loss against N per IsoFLOP budget: each budget's fitted curve over the sizes it was fitted to,
    and its minimum (star) where the fit puts it."""
    fig = figure.Figure(figsize=(7.5, 5), layout="constrained")
    ax = fig.add_subplot()
    norm, cmap = _flops_norm(fit), "viridis"
    a2 = fit["approach2"]
    budgets = a2.get("budgets", [])
    discrete = len(budgets) + len(a2.get("budgets_excluded", [])) <= DISCRETE_LEGEND_MAX
    method = a2.get("method", "parabola")
    for budget in budgets:
        colour = colors.to_hex(ScalarMappable(norm=norm, cmap=cmap).to_rgba(budget["flops"]))
        ax.scatter(budget["params"], budget["loss"], s=16, color=colour, zorder=2,
                   label=f"C = {budget['flops']:.3g}" if discrete else None)
        ax.plot(budget["curve"]["params"], budget["curve"]["loss"], color=colour, lw=1.2, zorder=2)
        ax.scatter([budget["N_opt"]], [budget["loss_opt"]], marker="*", s=120, color=colour,
                   edgecolor="k", linewidth=0.6, zorder=3)
    if a2.get("budgets_excluded"):  # one artist for all of them (a CSV without budgets can leave out hundreds)
        left_out = a2["budgets_excluded"]
        ax.scatter([n for b in left_out for n in b["params"]], [l for b in left_out for l in b["loss"]], s=22,
                   marker="x", color="C3", lw=0.8, zorder=2, label="budgets left out (no interior minimum)")
    ax.scatter([], [], marker="*", s=120, color="w", edgecolor="k",
               label=f"fitted minimum ({'Akima interpolation' if method == 'akima' else 'parabola'})")
    ax.set(xlabel=LABEL_N, ylabel=loss_label(fit),
           title=f"IsoFLOP curves (N: {fit.get('headline', {}).get('convention', 'as given')})")
    _log_scales(ax, True, False, f"no IsoFLOP budget to draw: {a2.get('note', 'no budgets')}")
    ax.legend(loc="best", fontsize=8)
    ax.grid(True, which="major", alpha=0.3)
    if not discrete:
        _colorbar(fig, ax, norm, cmap)
    return _save(fig, path)


def _yerr(value: float, ci: list[float]) -> list[list[float]]:
    """matplotlib's [[below], [above]] error bar of an interval; an interval that does not contain its value (a
    noise-draw percentile beside a point estimate) draws a zero-length bar on that side, never a negative one."""
    return [[max(value - ci[0], 0.0)], [max(ci[1] - value, 0.0)]]


def _power_law_band(draws: dict[str, list[float]], kind: str, flops_G: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    exps = np.array(draws["a" if kind == "N" else "b"], float)  # a failed draw is null: NaN, left out
    coefs = np.array(draws[f"{kind}_coef"], float)
    ok = np.isfinite(exps) & np.isfinite(coefs)
    pred_KG = coefs[ok, None] * flops_G[None, :] ** exps[ok, None]
    lo_G, hi_G = np.percentile(pred_KG, interval.PERCENTILES, axis=0,
                               method=interval.PERCENTILE_METHOD)
    return lo_G, hi_G


def plot_optimal(fit: dict[str, Any], path: str) -> str:
    """N_opt and D_opt against C: each approach's power law, its data, bootstrap 95% bands."""
    fig = figure.Figure(figsize=(11, 4.6), layout="constrained")
    axes = fig.subplots(1, 2)
    flops_G = _flops_range(fit)
    for ax, kind, key, label in ((axes[0], "N", "params", LABEL_N), (axes[1], "D", "tokens", LABEL_D)):
        env = fit["approach1"].get("envelope")
        if env and not all(env["at_edge"]):
            inner = ~np.array(env["at_edge"])
            ax.scatter(np.array(env["flops"])[inner], np.array(env[key])[inner], s=6, color="C0", alpha=0.5,
                       zorder=1, label="envelope points (approach 1)")
        budgets = fit["approach2"].get("budgets", [])
        if budgets:
            ax.scatter([b["C_opt"] for b in budgets], [b[f"{kind}_opt"] for b in budgets], s=30, color="C1",
                       edgecolor="k", linewidth=0.5, zorder=3, label="IsoFLOP minima")
        for name, (colour, style, text) in APPROACH_STYLE.items():
            res = fit[name]
            if res.get("a") is None:
                continue
            exponent = res["a" if kind == "N" else "b"]
            interval = res.get("a_ci95" if kind == "N" else "b_ci95")
            ci = f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else ""
            ax.plot(flops_G, res[f"{kind}_coef"] * flops_G**exponent, color=colour, ls=style, lw=1.6,
                    label=f"{text}: {'a' if kind == 'N' else 'b'} = {exponent:.3f}{ci}", zorder=2)
            draws = res.get("bootstrap", {}).get("draws")
            if draws and len(draws.get("a", [])) >= 2:
                lo_G, hi_G = _power_law_band(draws, kind, flops_G)
                ax.fill_between(flops_G, lo_G, hi_G, color=colour, alpha=0.15, lw=0)
        used = fit.get("frontier", {}).get("allocation")
        if used:  # the law predictions use (`allocation.law`)
            exponent = used["a" if kind == "N" else "b"]
            ax.plot(flops_G, used[f"{kind}_coef"] * flops_G**exponent, color="C3", ls="-", lw=1.0, alpha=0.8,
                    label=f"predictions: {used['from']} ({'a' if kind == 'N' else 'b'} = {exponent:.3f})", zorder=2)
        for p in fit.get("predictions", []):  # where the fit says the optimum lies beyond the grid
            if p.get(key) is not None:
                ci = p.get(f"{key}_ci95") or [p[key], p[key]]
                ax.errorbar([p["flops"]], [p[key]], yerr=_yerr(p[key], ci), fmt="D", color="C3",
                            ms=5, capsize=3, zorder=4, label="prediction (95% interval)")
        checked = fit.get("validation")
        if checked and fit["headline"]["convention"] == "eff":  # the model trained there, N_eff = C / (6·D)
            trained = checked["flops"] / 6.0 / checked["tokens"] if kind == "N" else checked["tokens"]
            ax.scatter([checked["flops"]], [trained], marker="X", s=60, color="k", zorder=5, label="validation run")
        ax.set(xlabel=LABEL_C, ylabel=f"optimal {label}", title=f"compute-optimal {label}")
        unfitted = "\n".join(f"approach {name[-1]}: {fit[name].get('note', 'not fitted')}"
                             for name in APPROACH_STYLE if fit[name].get("a") is None)
        missing = _no_predictions(fit, key)
        if _log_scales(ax, True, True, f"no compute-optimal {label} to draw\n{unfitted}" + (
                f"\n{missing}" if missing else "")) and missing:
            _note(ax, missing, y=0.1)
        ax.grid(True, which="major", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="upper left")
    return _save(fig, path)


def lower_envelope(flops: np.ndarray, loss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lowest loss reached with compute ≤ C, at each C (sorted): monotone non-increasing."""
    order = np.argsort(flops, kind="stable")
    return np.asarray(flops)[order], np.minimum.accumulate(np.asarray(loss)[order])


def plot_frontier(fit: dict[str, Any], path: str) -> str:
    """Loss against compute: all runs, their lower envelope, approach 2's minima, the frontier
    L_opt(C) = E + k·C^-γ with its 95% band, approach 3's optimum, predictions with intervals, and a
    sweep's validation run (fit["validation"]) beside its prediction."""
    fig = figure.Figure(figsize=(7.5, 5), layout="constrained")
    ax = fig.add_subplot()
    pts = _points(fit)
    ax.scatter(pts["flops"], pts["loss"], s=10, c="0.75", label="runs (final loss)", zorder=1)
    env = fit["approach1"].get("envelope")
    if env:
        env_c, env_l = lower_envelope(np.array(env["flops"]), np.array(env["loss"]))
        ax.plot(env_c, env_l, color="C0", lw=1.5, drawstyle="steps-post",
                label=f"lower envelope: best loss at compute ≤ C ({fit['approach1']['envelope_from']})", zorder=2)
    budgets = fit["approach2"].get("budgets", [])
    if budgets:
        ax.scatter([b["C_opt"] for b in budgets], [b["loss_opt"] for b in budgets], marker="*", s=90,
                   color="C1", edgecolor="k", linewidth=0.5, label="IsoFLOP minima (approach 2)", zorder=3)
    flops_G = _flops_range(fit)
    predictions = fit.get("predictions", [])
    if predictions:
        flops_G = np.geomspace(flops_G[0], max(flops_G[-1], max(p["flops"] for p in predictions) * 1.5), 200)
    front = fit.get("frontier", {})
    law = front.get("law")
    if law:
        mix = f", averaged with the {'free' if law['weight_held'] >= 0.5 else 'held'}-E law " \
              f"(weight {min(law['weight_held'], 1 - law['weight_held']):.2f})" if "weight_held" in law else ""
        ax.plot(flops_G, frontier.loss_at(law, flops_G), color="C1", ls="--", lw=1.4,
                label=f"frontier {law['E']:.3f} + k·C^-{law['gamma']:.3f}{mix}", zorder=2)
        draws = front.get("bootstrap", {}).get("draws")
        if draws:
            arrays = {k: v[:, None] for k, v in frontier.draw_arrays(draws).items()}
            with np.errstate(over="ignore", invalid="ignore"):
                band_KG = frontier.loss_at(arrays, flops_G[None, :])
            ok_K = np.all(np.isfinite(band_KG), axis=1)
            if ok_K.sum() >= 2:
                lo_G, hi_G = np.percentile(band_KG[ok_K], interval.PERCENTILES, axis=0,
                                           method=interval.PERCENTILE_METHOD)
                ax.fill_between(flops_G, lo_G, hi_G, color="C1", alpha=0.15, lw=0)
    for p in predictions:
        if p.get("loss") is None:
            continue
        ci = p.get("loss_ci95") or [p["loss"], p["loss"]]
        ax.errorbar([p["flops"]], [p["loss"]], yerr=_yerr(p["loss"], ci), fmt="D",
                    color="C3", ms=5, capsize=3, zorder=4)
    if any(p.get("loss") is not None for p in predictions):
        ax.errorbar([], [], yerr=[], fmt="D", color="C3", ms=5, capsize=3, label="prediction (95% interval)")
    checked = fit.get("validation")
    if checked and checked.get("measured_loss") is not None:  # the sweep's prediction check (its own run)
        ax.scatter([checked["flops"]], [checked["measured_loss"]], marker="X", s=80, color="k", zorder=5,
                   label=f"measured: {checked['measured_loss']:.4f} ({100 * checked['relative_error']:+.2f}% vs "
                         f"predicted {checked['predicted_loss']:.4f})")
    a3 = fit["approach3"]
    if a3.get("a") is not None:
        n_G, d_G = a3["N_coef"] * flops_G ** a3["a"], a3["D_coef"] * flops_G ** a3["b"]
        loss_G = parametric.law_loss(*(a3[k] for k in ("E", "A", "B", "alpha", "beta")), n_G, d_G)
        ax.plot(flops_G, loss_G, color="C2", lw=1.2, label="approach 3: L(N_opt(C), D_opt(C))", zorder=2)
    if not law:
        _note(ax, f"no frontier: {front.get('note') or fit['approach2'].get('note', 'no budget minima')}", y=0.85,
              width=90)
    missing = _no_predictions(fit, "loss")
    if missing:
        _note(ax, missing, y=0.7, width=90)
    ax.set(xscale="log", xlabel=LABEL_C, ylabel=loss_label(fit),
           title="loss frontier" if fit.get("metric", "eval_loss") == "eval_loss" else f"{fit['metric']} frontier")
    ax.set_ylim(top=min(ax.get_ylim()[1], float(np.quantile(pts["loss"], 0.9)) * 1.05))
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def trust_problems(fit: dict[str, Any]) -> list[str]:
    """Why approach 3's L(N, D) should not be trusted (empty: no reason found)."""
    a3, a2 = fit["approach3"], fit["approach2"]
    problems = []
    if a3.get("warning"):
        problems.append(f"residual RMS {a3['residual_rms']:.3f} ≫ noise")
    if max(a3.get("alpha") or 0, a3.get("beta") or 0) > 1.5:
        problems.append(f"α = {a3['alpha']:.2f}, β = {a3['beta']:.2f} run away")
    if a3.get("a") is not None and a2.get("a") is not None and abs(a3["a"] - a2["a"]) > 0.1:
        problems.append(f"a = {a3['a']:.2f} vs approach 2's {a2['a']:.2f}")
    return problems


def contour_levels(loss_GG: np.ndarray, measured: np.ndarray, count: int = 16) -> np.ndarray:
    """Log-spaced loss levels from the lowest predicted (or measured) loss to the highest measured one:
    a fit that runs off to huge losses away from the runs saturates there instead of flattening the
    colours where the runs are."""
    bottom = float(min(np.nanmin(loss_GG), np.min(measured)))
    return np.geomspace(bottom, max(float(np.max(measured)), bottom * 1.01), count)


def plot_contours(fit: dict[str, Any], path: str) -> str | None:
    """Approach 3's L(N, D) contours (log-spaced levels, clipped at the highest measured loss), the
    IsoFLOP lines and the compute-optimal line; says on the plot when the fit is not to be trusted."""
    a3 = fit["approach3"]
    if a3.get("a") is None:
        return None
    pts = _points(fit)
    n_G = np.geomspace(pts["params"].min() / 3, pts["params"].max() * 3, 200)
    d_G = np.geomspace(pts["tokens"].min() / 3, pts["tokens"].max() * 3, 200)
    with np.errstate(over="ignore"):
        loss_GG = parametric.law_loss(*(a3[k] for k in ("E", "A", "B", "alpha", "beta")), n_G[None, :], d_G[:, None])
    levels = contour_levels(loss_GG, pts["loss"])
    top = levels[-1]
    fig = figure.Figure(figsize=(7.5, 5.5), layout="constrained")
    ax = fig.add_subplot()
    norm = colors.LogNorm(vmin=levels[0], vmax=levels[-1])
    filled = ax.contourf(n_G, d_G, np.minimum(loss_GG, top * 10), levels=levels, cmap="magma_r",
                         norm=norm, extend="max")
    ax.contour(n_G, d_G, loss_GG, levels=levels, colors="k", linewidths=0.3)
    fig.colorbar(filled, ax=ax, ticks=levels[::3], format="%.2f",
                 label="predicted loss (log scale; clipped at the highest run's)")
    a2 = fit["approach2"]
    budgets = sorted({b["flops"] for b in a2.get("budgets", []) + a2.get("budgets_excluded", [])})
    if not budgets:
        budgets = list(np.geomspace(pts["flops"].min(), pts["flops"].max(), 5))
    for c in budgets:
        ax.plot(n_G, c / (6 * n_G), color="w", ls="--", lw=0.8)
    ax.plot([], [], color="w", ls="--", lw=0.8, label="IsoFLOP lines C = 6ND")
    flops_G = np.geomspace(6 * n_G[0] * d_G[0], 6 * n_G[-1] * d_G[-1], 200)
    ax.plot(a3["N_coef"] * flops_G ** a3["a"], a3["D_coef"] * flops_G ** a3["b"], color="C2", lw=2,
            label=f"compute-optimal: $N_{{opt}} \\propto C^{{{a3['a']:.3f}}}$")
    ax.scatter(pts["params"], pts["tokens"], s=8, color="C0", edgecolor="w", linewidth=0.3, label="runs")
    ax.set(xscale="log", yscale="log", xlabel=LABEL_N, ylabel=LABEL_D,
           xlim=(n_G[0], n_G[-1]), ylim=(d_G[0], d_G[-1]), title="approach 3: L(N, D) contours")
    problems = trust_problems(fit)
    if problems:
        ax.text(0.02, 0.02, "fit not trusted: " + "; ".join(problems), transform=ax.transAxes, fontsize=8,
                color="w", bbox={"facecolor": "C3", "alpha": 0.85, "edgecolor": "none"}, zorder=5)
    leg = ax.legend(fontsize=8, loc="upper right", facecolor="0.3", labelcolor="w", framealpha=0.8)
    leg.get_frame().set_edgecolor("w")
    return _save(fig, path)


def plot_backtest(fit: dict[str, Any], path: str) -> str | None:
    """The frontier's backtest: each refit's relative error at the later budgets against the extrapolation
    factor C_j / C_k, with the prediction interval's extrapolation term ±q·x/span^p at the fit's own span (None: no
    backtest)."""
    bt = fit.get("frontier", {}).get("backtest") or {}
    terms = fit.get("frontier", {}).get("interval") or {}
    if not bt.get("pairs"):
        return None
    fig = figure.Figure(figsize=(7, 4.5), layout="constrained")
    ax = fig.add_subplot()
    ks = sorted({p["k"] for p in bt["pairs"]})
    for i, k in enumerate(ks):
        sel = [p for p in bt["pairs"] if p["k"] == k]
        ax.plot([np.exp(p["distance"]) for p in sel], [100 * (np.exp(p["log_error"]) - 1) for p in sel], "o-",
                color=f"C{i % 10}", ms=4, lw=1, label=f"fit to the first {k} budgets (≤ {sel[0]['fit_flops']:.2g})")
    if terms.get("span"):
        x_G = np.linspace(0, max(p["distance"] for p in bt["pairs"]) * 1.1, 50)
        power = terms.get("span_power", 1.0)  # a fit.json written before 2026-11-27: x/span, no γ
        gamma, a = terms.get("gamma"), terms.get("gamma_power", 0.0)
        lever_G = np.array([backtest.lever(x, terms["span"], gamma, span_power=power, gamma_power=a)
                            for x in x_G])  # the interval's own lever
        half_G = 100 * (np.exp(terms["spread"] * lever_G) - 1)
        steep = f"·γ^{a:g}" if gamma is not None else ""
        ax.fill_between(np.exp(x_G), -half_G, half_G, color="0.5", alpha=0.2, lw=0,
                        label=f"95% interval's extrapolation term ±q·x{steep}/span^{power:g} (q = {terms['spread']:g}, "
                              f"the fit's span {terms['span']:.2f}" + (f", γ {gamma:.3f}" if gamma is not None else "")
                              + "; without the noise term)")
    ax.axhline(0, color="k", lw=0.6)
    ax.set(xscale="log", xlabel="extrapolation factor C / C_largest fitted",
           ylabel="predicted / measured optimal loss − 1 (%)", title="frontier backtest")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, path)


def write_all(fit: dict[str, Any], out_dir: str) -> list[str]:
    """Write every figure under `out_dir`; returns the paths written."""
    written = [
        plot_backtest(fit, os.path.join(out_dir, "backtest.png")),
        plot_isoflops(fit, os.path.join(out_dir, "isoflops.png")),
        plot_optimal(fit, os.path.join(out_dir, "optimal_scaling.png")),
        plot_frontier(fit, os.path.join(out_dir, "loss_frontier.png")),
        plot_contours(fit, os.path.join(out_dir, "loss_contours.png")),
    ]
    return [p for p in written if p is not None]
