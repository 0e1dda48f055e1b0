"""Leave-future-out backtests of the compute-optimal allocation N_opt(C) on published IsoFLOP sets, and its
leave-one-budget-out stability, under each rule of `experiments.allocation_rules` (for `experiments.reproduce`).

For every set and every origin C (`reproduce_frontier.origins`: each budget in turn), approach 2 (with its loss-noise
draws) and approach 3 (on the points near an optimum) are fitted on the points of the budgets up to C alone, and each
rule predicts N_opt at the C_opt of every later budget with a minimum; the truth is that budget's own approach-2
minimum (N_opt of the full set's fit). A pair's error is ln(N̂/N), its regime the extrapolation factor
C_target / C ("<4x", "≥4x", "4–16x" as the frontier's tables). Its 95% interval: the percentiles of N̂ over the
noise draws (`frontier.predictions`'s params_ci95), covered where the truth lies inside.

The stability: each set fitted on every budget, N_opt at 4× the largest budget, each budget dropped in turn
(`allocation_rules.moves`): max / mean |change|.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from experiments import allocation_rules as allocation
from experiments import reproduce_frontier as rf
from transformer.scaling import fits, interval, noise
from transformer.scaling import points as points_lib

Sets = list[tuple[str, points_lib.Points, dict[str, str]]]


def _fit(pts: points_lib.Points, samples: int, seed: int = 0) -> tuple[dict, dict | None, dict, points_lib.Points]:
    """(approach 2, its noise draws or None, approach 3 near the optima, the points approach 3 fitted), as
    `predict.frontier_predictions` fits them."""
    sigma = noise.estimate(pts)
    a2 = fits.approach2(pts)
    draws2 = None
    if sigma["sigma"] and a2.get("a") is not None and samples:
        draws2 = fits.approach2_draws(a2, sigma["sigma"], samples, np.random.default_rng(seed))
    a3, chosen = fits.approach3_near_optimum(pts, a2, fits.APPROACH3_NEAR, sigma["sigma"])
    return a2, draws2, a3, chosen


def lfo(name: str, pts: points_lib.Points, samples: int) -> list[dict[str, Any]]:
    """One record per (rule, origin, later minimum): {"rule", "data", "origin", "flops", "ratio", "truth",
    "predicted", "error" (ln N̂/N), "error_tokens" (ln D̂/D), "N_opt_from", and with draws "covered", "width"
    ((hi − lo) / N̂)}."""
    rows = []
    for c, sub, later, _ in rf.origins(pts.canonical()):
        a2, draws2, a3, _ = _fit(sub, samples)
        if a2.get("a") is None:
            continue
        for rule in allocation.RULES:
            law, draws = allocation.choose(a2, a3, draws2, rule)
            for b in later:
                n_hat, d_hat = allocation.at(law, b["C_opt"])
                rec: dict[str, Any] = {"rule": rule, "data": name, "origin": c, "flops": b["flops"],
                                       "ratio": b["flops"] / c, "truth": b["N_opt"], "predicted": float(n_hat),
                                       "error": float(np.log(n_hat / b["N_opt"])),
                                       "error_tokens": float(np.log(d_hat / b["D_opt"])),
                                       "N_opt_from": law["N_opt_from"]}
                if draws is not None:
                    ends = interval.percentile_ends(allocation.at(draws, b["C_opt"])[0])
                    if ends is not None:
                        rec.update(covered=bool(ends[0] <= b["N_opt"] <= ends[1]), width=(ends[1] - ends[0]) / n_hat)
                rows.append(rec)
    return rows


def stability(name: str, pts: points_lib.Points, samples: int, factor: float = 4.0) -> list[dict[str, Any]]:
    """Per rule: N_opt at `factor` × the largest budget, max and mean |change| with any one budget dropped."""
    pts = pts.canonical()
    a2, draws2, a3, chosen = _fit(pts, samples)
    if len(a2.get("budgets", [])) < 3 or a2.get("a") is None:
        return []
    noise_sd = allocation.minima_noise(draws2["N_opt"]) if draws2 is not None else None
    moves = allocation.moves(chosen, a2, a3, noise_sd, [factor * float(pts.flops_P.max())], allocation.RULES)
    return [{"data": name, "rule": rule, "max": float(np.abs(m).max()), "mean": float(np.abs(m).mean())}
            for rule, m in moves.items()]


def coverage(rows: list[dict[str, Any]]) -> str:
    """'coverage (each set weighs 1), median width' of the rows with an interval, or '–'."""
    s = rf.summary(rows)
    return f"{100 * s['coverage']:.0f}%, {100 * s['median_width']:.1f}%" if s["n"] else "–"


def run(sets: Sets, samples: int) -> tuple[dict[str, Any], list[str]]:
    """The allocation's rules compared on the leave-future-out pairs (errors, and chosen out of sample: per source,
    the rule with the lowest `reproduce_frontier.criterion` on the other sources' pairs), the 95% intervals'
    coverage, and the leave-one-budget-out stability, as (JSON-ready results, Markdown lines)."""
    rows = [{**r, **tags} for name, pts, tags in sets for r in lfo(name, pts, samples)]
    by_rule = {rule: [r for r in rows if r["rule"] == rule] for rule in allocation.RULES}
    nested = rf.nested_choice(by_rule)
    groups = lambda rs: [("Porian et al. (15)", [r for r in rs if r["family"] == "Porian"]),  # noqa: E731
                         ("other 6", [r for r in rs if r["family"] != "Porian"]), ("all", rs)]
    lines = ["Rules for N_opt, leave-future-out: median |ln(N̂/N)| per regime (median over sets of each set's "
             "median | pooled); 95% interval (noise draws): coverage, median width",
             "| rule | family | " + " | ".join(regime for regime, _ in rf.SHOWN) + " | covers, width: "
             + " | ".join(regime for regime, _ in rf.REGIMES) + " |",
             "|---|---|" + "---|" * (len(rf.SHOWN) + len(rf.REGIMES))]
    for rule, rs in list(by_rule.items()) + [("chosen out of sample", nested["rows"])]:
        for fam, sel in groups(rs):  # (the chosen rows mix rules with and without an interval: no coverage)
            lines.append(f"| {rule} | {fam} | " + " | ".join(rf._errors([r for r in sel if in_regime(r)])
                                                              for _, in_regime in rf.SHOWN) + " | "
                         + " | ".join(coverage([r for r in sel if in_regime(r)]) if rule in by_rule else "–"
                                      for _, in_regime in rf.REGIMES) + " |")
    lines.append("criterion (mean over <4x and ≥4x of the median over sets; what the nested choice minimises): "
                 + ", ".join(f"{rule} {100 * rf.criterion(rs):.2f}%" for rule, rs in by_rule.items()))
    lines.append("picked per source: " + ", ".join(
        f"{rule}: {sum(1 for v in nested['picked'].values() if v == rule)}" for rule in allocation.RULES))
    tested = by_rule.get("held (χ² test)", [])
    held = sum(r["N_opt_from"].startswith("approach 3") for r in tested)
    lines.append(f"held (χ² test): the exponent held in {held} of {len(tested)} pairs; median |ln(D̂/D)| over all "
                 "pairs: " + ", ".join(f"{rule} {100 * np.median(np.abs([r['error_tokens'] for r in rs])):.2f}%"
                                       for rule, rs in by_rule.items()))
    stab = [s for name, pts, _ in sets for s in stability(name, pts, samples)]
    lines += ["", "N_opt at 4x the largest budget, leave one budget out: max / mean |change|",
              "| data | " + " | ".join(allocation.RULES) + " |", "|---|" + "---|" * len(allocation.RULES)]
    for name in dict.fromkeys(s["data"] for s in stab):
        cells = [next((f"{100 * s['max']:.1f} / {100 * s['mean']:.1f}%" for s in stab
                       if s["data"] == name and s["rule"] == rule), "–") for rule in allocation.RULES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    result = {"pairs": rows, "picked": nested["picked"], "stability": stab,
              "criterion": {rule: rf.criterion(rs) for rule, rs in by_rule.items()}}
    return result, lines
