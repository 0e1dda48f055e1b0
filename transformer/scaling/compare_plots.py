"""compare.png: a variant against a baseline, drawn from the compare.json content (`compare.compare`).

Legend: G = compute values on a drawn line, K = noise draws.

Top panel: both loss frontiers L_opt(C) with their 95% bands (from the fits' noise draws), each sweep's
measured IsoFLOP minima (stars) and, for budgets without an interior minimum, their lowest loss (x).
Bottom panel: the compute multiplier C_base(L_var(C)) / C against C with its 95% band, the line at 1
(no difference) and the values at the grid's budgets and at --at_flops with their intervals.
"""
from __future__ import annotations

import math
import textwrap
from typing import Any

import numpy as np
from matplotlib import figure, ticker

from transformer.scaling import frontier, interval
from transformer.scaling.compare import ROLES, multiplier
from transformer.scaling.plots import LABEL_C, LABEL_LOSS

STYLE = {"baseline": ("C0", "baseline"), "variant": ("C3", "variant")}
BAND_FLOOR = 2  # draws needed for a band
TITLE_WIDTH = 88  # characters of the title's lines at fontsize 10 on the 7.5-inch figure; longer ones wrap


def _draws(fit: dict[str, Any]) -> dict[str, np.ndarray] | None:
    """compare.json's stored draws of one fit's frontier, (K, 1) each against compute values (G,)."""
    draws = frontier.draw_arrays(fit["frontier"].get("draws"))
    return None if draws is None else {k: v[:, None] for k, v in draws.items()}


def _band(values_KG: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """2.5th and 97.5th percentiles per column over the draws without NaN (`interval.percentile_ends`: an end
    among infinite draws is +inf)."""
    ok_K = ~np.any(np.isnan(values_KG), axis=1)
    if ok_K.sum() < BAND_FLOOR:
        return None
    lo_G, hi_G = np.array([interval.percentile_ends(column, keep_infinite=True) for column in values_KG[ok_K].T]).T
    return lo_G, hi_G


def plot_compare(result: dict[str, Any], path: str) -> str:
    """Writes compare.png (see the module docstring); returns its path."""
    draw(result).savefig(path, dpi=130)
    return path


def draw(result: dict[str, Any]) -> figure.Figure:
    """compare.png's figure (see the module docstring)."""
    fig = figure.Figure(figsize=(7.5, 8.0), layout="constrained")
    ax_loss, ax_m = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    budgets_B = np.array(result["grid"]["budgets"], float)
    at = result["options"]["at_flops"]
    flops_G = np.geomspace(min(budgets_B.min(), at) / 1.5, max(budgets_B.max(), at) * 1.5, 200)
    fits = result["fits"]
    measured_losses = []
    for role in ROLES:
        colour, name = STYLE[role]
        law = fits[role]["frontier"].get("law")
        draws = _draws(fits[role])
        if law:
            ax_loss.plot(flops_G, frontier.loss_at(law, flops_G), color=colour, lw=1.5,
                         label=f"{name}: L_opt = {law['E']:.3f} + k·C^-{law['gamma']:.3f}")
            if draws is not None:
                with np.errstate(over="ignore", invalid="ignore"):
                    band = _band(frontier.loss_at(draws, flops_G))
                if band:
                    ax_loss.fill_between(flops_G, *band, color=colour, alpha=0.15, lw=0)
        minima = fits[role]["approach2"]["budgets"]
        ax_loss.scatter([b["C_opt"] for b in minima], [b["loss_opt"] for b in minima], marker="*", s=110,
                        color=colour, edgecolor="k", linewidth=0.5, zorder=3,
                        label=f"{name}: IsoFLOP minima (approach 2)")
        measured_losses += [b["loss_opt"] for b in minima]
        lowest = [(rec["flops"], rec["measured"][role]["lowest_loss"]) for rec in result["budgets"]
                  if rec.get("measured", {}).get(role, {}).get("loss_opt") is None and "measured" in rec]
        if lowest:
            ax_loss.scatter(*zip(*lowest), marker="x", s=40, color=colour, zorder=3,
                            label=f"{name}: lowest loss, budget without an interior minimum")
            measured_losses += [loss for _, loss in lowest]
    ax_loss.axvline(at, color="0.5", ls=":", lw=1)
    if measured_losses:
        span = max(measured_losses) - min(measured_losses)
        ax_loss.set_ylim(min(measured_losses) - 0.6 * span - 0.02, max(measured_losses) + 0.3 * span + 0.02)
    ax_loss.set(xscale="log", ylabel=LABEL_LOSS)
    ax_loss.set_title("\n".join(textwrap.fill(line, TITLE_WIDTH, subsequent_indent="  ")
                                 for line in _title(result).split("\n")), fontsize=10)
    ax_loss.grid(True, which="major", alpha=0.3)
    ax_loss.legend(fontsize=7)
    _multiplier_panel(ax_m, result, flops_G)
    return fig


def _verdict(ci: list | None) -> str:
    if not ci:
        return ""
    if ci[0] is not None and ci[0] > 1:
        return "variant better"
    if ci[1] is not None and ci[1] < 1:
        return "baseline better"
    return "no clear difference"


def _multiplier(rec: dict[str, Any]) -> float | None:
    """A budget's multiplier: inf where compare found it infinite (the variant below the baseline's E), None
    where there is none (no frontier)."""
    m = rec.get("compute_multiplier")
    return m if m is not None else (math.inf if rec.get("note", "").startswith("infinite") else None)


def _times(m: float) -> str:
    return "infinite" if math.isinf(m) else f"{m:.2f}x"


def _title(result: dict[str, Any]) -> str:
    """Two lines: the multiplier over the measured budgets (what to read) and at the extrapolated compute."""
    measured = [(m, b) for b in result["budgets"] if (m := _multiplier(b)) is not None]
    lines = []
    if measured:
        m_B = [m for m, _ in measured]
        verdicts = [_verdict(b.get("compute_multiplier_ci95")) for _, b in measured]
        counts = ", ".join(f"{v} at {verdicts.count(v)}" for v in dict.fromkeys(verdicts) if v)
        lines.append(f"at the {len(result['budgets'])} measured budgets: {_times(min(m_B))} to {_times(max(m_B))}"
                     + (f" ({counts} of {len(measured)})" if counts else ""))
    ext = result["extrapolated"]
    m, ci = _multiplier(ext), ext.get("compute_multiplier_ci95")
    ends = "" if not ci else " [" + ", ".join("inf" if x is None else f"{x:.3g}" for x in ci) + "]"
    verdict = f", {_verdict(ci)}" if ci and m is not None else ""
    lines.append(f"at C = {ext['flops']:.3g} (extrapolated): {'n/a' if m is None else _times(m)}{ends}{verdict}")
    return "compute multiplier " + "\n".join(lines)


def _multiplier_panel(ax: Any, result: dict[str, Any], flops_G: np.ndarray) -> None:
    fits = result["fits"]
    laws = {role: fits[role]["frontier"].get("law") for role in ROLES}
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel=LABEL_C, ylabel="compute multiplier C_base(L_var(C)) / C")
    if not all(laws.values()):
        ax.text(0.5, 0.5, "no multiplier: a sweep has no frontier", transform=ax.transAxes, ha="center")
        return
    m_G = multiplier(laws["baseline"], frontier.loss_at(laws["variant"], flops_G), flops_G)
    draws = {role: _draws(fits[role]) for role in ROLES}
    band = None
    if all(d is not None for d in draws.values()):
        with np.errstate(over="ignore", invalid="ignore"):
            band = _band(multiplier(draws["baseline"], frontier.loss_at(draws["variant"], flops_G), flops_G))
    marks = [(r, "o") for r in result["budgets"]] + [(result["extrapolated"], "D")]
    # The axis spans 1, the multipliers and their finite positive interval ends (not the band, which may run off; a
    # lower end that underflowed to 0, from draws of a frontier far steeper than the other's, has no place on a log
    # axis: the min of 0 made the axis limits 0 and the tick formatter divided by it).
    shown = [1.0] + [x for r, _ in marks for x in [r.get("compute_multiplier"), *(r.get("compute_multiplier_ci95") or [])]
                     if x is not None and x > 0]
    bottom, top = min(shown) / 1.4, max(shown) * 1.4
    ax.set_ylim(bottom, top)
    ax.plot(flops_G, np.where(np.isfinite(m_G), m_G, np.nan), color="C3", lw=1.5, label="variant against baseline")
    if band:
        lo_G, hi_G = (np.clip(b, bottom / 10, top * 10) for b in band)
        ax.fill_between(flops_G, lo_G, hi_G, color="C3", alpha=0.15, lw=0, label="95% interval (noise draws)")
    for rec, marker in marks:
        m, ci = rec.get("compute_multiplier"), rec.get("compute_multiplier_ci95")
        if m is None:
            continue
        lo, hi = ci if ci else (m, m)
        lo = m if lo is None else lo
        ax.errorbar([rec["flops"]], [m], yerr=[[m - lo], [(top if hi is None else hi) - m]], fmt=marker, color="C3",
                    ms=5, capsize=3, zorder=3)
        if hi is None:  # an infinite upper end runs to the top of the axis
            ax.annotate("inf", (rec["flops"], top), xytext=(0, -10), textcoords="offset points", ha="center",
                        fontsize=7, color="C3")
    ax.errorbar([], [], yerr=[], fmt="o", color="C3", ms=5, capsize=3, label="at the grid's budgets")
    ax.errorbar([], [], yerr=[], fmt="D", color="C3", ms=5, capsize=3,
                label=f"at --at_flops ({result['extrapolated']['at_flops_from']})")
    ax.axvline(result["options"]["at_flops"], color="0.5", ls=":", lw=1)
    times = ticker.FuncFormatter(lambda v, _: f"{v:.3g}x")
    ax.yaxis.set_major_formatter(times)
    ax.yaxis.set_minor_formatter(times if top / bottom < 30 else ticker.NullFormatter())
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.text(0.01, 0.97, "above 1: the variant is better", transform=ax.transAxes, va="top", fontsize=7)
    ax.text(0.01, 0.03, "below 1: the baseline is better", transform=ax.transAxes, va="bottom", fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
