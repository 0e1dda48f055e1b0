"""Leave-future-out backtests of the compute-optimal allocation N_opt(C) on published IsoFLOP sets, and its
leave-one-budget-out stability, under each rule of `experiments.allocation_rules` (for `experiments.reproduce`).

For every set and every origin C (`reproduce_frontier.origins`: each budget in turn), approach 2 (with its loss-noise
draws) and approach 3 (on the points near an optimum) are fitted on the points of the budgets up to C alone, and each
rule predicts N_opt at the C_opt of every later budget with a minimum; the truth is that budget's own approach-2
minimum (N_opt of the full set's fit). A pair's error is ln(N̂/N), its regime the extrapolation factor
C_target / C ("<4x", "≥4x", "4–16x" as the frontier's tables). Each rule's interval from its draws: the percentiles
of N̂ over the noise draws (what `frontier.predictions`'s params_ci95 was before), covered where the truth lies inside.

The shipped interval (`transformer.scaling.allocation.interval_at`, the shipped rule's pairs): the truth is itself noisy,
so a pair is covered ("fair") where |ln(N̂/N)| ≤ sqrt(h² + (1.96·σ_observed)²), σ_observed the sd of that budget's
ln N_opt over the full set's noise draws (`observed_noise`). Its constant q is the conformal 95% quantile of the
score each pair needs (`backtest.needed_spread`, `backtest.conformal_multiplier` with each set weighing 1), out of
sample each source's from the other sources' pairs (`calibrate`), for the shipped form and the others tried (FORMS).

The stability: each set fitted on every budget, N_opt at 4× the largest budget, each budget dropped in turn
(`allocation_rules.moves`): max / mean |change|.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from experiments import allocation_rules as allocation
from experiments import reproduce_frontier as rf
from transformer.scaling import allocation as shipped
from transformer.scaling import backtest, fits, interval, noise, refits
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


def observed_noise(pts: points_lib.Points, samples: int, seed: int = 0) -> dict[float, dict[str, float | None]]:
    """Each budget's minimum as observed with every budget (a backtest's truth) and its own noise: {budget flops:
    {"params", "tokens": the sd of ln N_opt, ln D_opt over its noise draws (None without)}}."""
    sigma = noise.estimate(pts)["sigma"]
    a2 = fits.approach2(pts)
    draws2 = fits.approach2_draws(a2, sigma, samples, np.random.default_rng(seed)) \
        if sigma and a2.get("a") is not None and samples else None
    return {b["flops"]: {key: backtest.log_sd(draws2[minima][i]) if draws2 is not None else None
                         for key, minima, _, _ in shipped.QUANTITIES} for i, b in enumerate(a2["budgets"])}


def _interval(rec: dict[str, Any], b: dict[str, Any], a2: dict[str, Any], draws2: dict | None,
              law_draws: dict | None, source: str, observed: dict[str, float | None]) -> None:
    """Adds to a pair of the shipped rule what the shipped interval (`allocation.interval_at`: σ_scatter from
    approach 2's minima and their draws `draws2`, σ_noise from the rule's own draws `law_draws`) and the
    candidates need, per
    quantity (prefix "" for N_opt, "tokens_" for D_opt): "noise_half" (1.96·σ_noise at C), "obs_half" (1.96 × the
    observed minimum's own sd), "lever" (σ_scatter·lev), "lever_span" (x/span: the loss frontier's lever until
    2026-11-27), "half" (h), "covered" (shipped q,
    the observation's noise in quadrature), "width" (2·sinh h); "covered_before" / "covered_before_fair" and
    "width_before": the interval before (percentiles of the draws), strictly and with the observation's noise."""
    shared = shipped.shared_terms(a2, draws2)
    log_c = np.log([bb["C_opt"] for bb in a2["budgets"]])
    for key, _, coef, exponent in shipped.QUANTITIES:
        p = "" if key == "params" else "tokens_"
        value = rec["predicted"] if key == "params" else rec["predicted_tokens"]
        err, obs_half = rec[f"error{'_tokens' if p else ''}"], backtest.Z * (observed.get(key) or 0.0)
        with np.errstate(over="ignore", invalid="ignore"):
            v_K = law_draws[coef] * b["C_opt"] ** law_draws[exponent] if law_draws is not None else None
        ci, terms = shipped.interval_at(value, b["C_opt"], backtest.log_sd(v_K) if v_K is not None else None,
                                        source, shared, key)
        if not ci.exists or terms["scatter_sd_log"] is None:
            continue
        half = terms["half_width_log"]
        rec.update({f"{p}noise_half": terms["noise_half_width_log"], f"{p}obs_half": obs_half,
                    f"{p}lever": terms["scatter_sd_log"] * terms["leverage"],
                    f"{p}lever_span": backtest.lever(np.log(b["C_opt"]) - log_c.max(), np.ptp(log_c), span_power=1.0),
                    f"{p}half": half, f"{p}covered": bool(abs(err) <= np.hypot(half, obs_half)),
                    f"{p}width": float(2 * np.sinh(half))})
        ends = interval.percentile_ends(v_K) if v_K is not None else None
        if ends is not None:
            side = np.log(value / ends[0]) if err > 0 else np.log(ends[1] / value)  # the end the truth lies beyond
            rec.update({f"{p}covered_before": bool(abs(err) <= side), f"{p}width_before": (ends[1] - ends[0]) / value,
                        f"{p}covered_before_fair": bool(abs(err) <= np.hypot(side, obs_half))})


def lfo(name: str, pts: points_lib.Points, samples: int) -> list[dict[str, Any]]:
    """One record per (rule, origin, later minimum): {"rule", "data", "origin", "flops", "ratio", "truth",
    "predicted", "predicted_tokens", "error" (ln N̂/N), "error_tokens" (ln D̂/D), "N_opt_from", and with draws
    "covered_draws", "width_draws" (the rule's percentile interval, (hi − lo) / N̂)}; the shipped rule's pairs also
    carry its interval's terms (`_interval`)."""
    rows = []
    observed = observed_noise(pts.canonical(), samples)
    for c, sub, later, _ in rf.origins(pts.canonical()):
        a2, draws2, a3, _ = _fit(sub, samples)
        if a2.get("a") is None:
            continue
        source = interval.noise_kind(noise.estimate(sub))
        for rule in allocation.RULES:
            law, draws = allocation.choose(a2, a3, draws2, rule)
            for b in later:
                n_hat, d_hat = allocation.at(law, b["C_opt"])
                rec: dict[str, Any] = {"rule": rule, "data": name, "origin": c, "flops": b["flops"],
                                       "ratio": b["flops"] / c, "truth": b["N_opt"], "predicted": float(n_hat),
                                       "predicted_tokens": float(d_hat), "error": float(np.log(n_hat / b["N_opt"])),
                                       "error_tokens": float(np.log(d_hat / b["D_opt"])),
                                       "N_opt_from": law["N_opt_from"]}
                if draws is not None:
                    ends = interval.percentile_ends(allocation.at(draws, b["C_opt"])[0])
                    if ends is not None:
                        rec.update(covered_draws=bool(ends[0] <= b["N_opt"] <= ends[1]),
                                   width_draws=(ends[1] - ends[0]) / n_hat)
                if rule == allocation.SHIPPED:
                    _interval(rec, b, a2, draws2, draws, source, observed[b["flops"]])
                rows.append(rec)
    return rows


def stability(name: str, pts: points_lib.Points, samples: int) -> list[dict[str, Any]]:
    """Per rule: N_opt where a fit without `--predict_flops` asks (`refits.reference_flops`, as fit.json's
    "sensitivity"), max and mean |change| with any one budget dropped."""
    pts = pts.canonical()
    a2, draws2, a3, chosen = _fit(pts, samples)
    if len(a2.get("budgets", [])) < 3 or a2.get("a") is None:
        return []
    noise_sd = backtest.median_log_sd(draws2["N_opt"]) if draws2 is not None else None
    at = refits.reference_flops(a2)
    moves = allocation.moves(chosen, a2, a3, noise_sd, [at], allocation.RULES)
    return [{"data": name, "rule": rule, "at_flops": at, "max": float(np.abs(m).max()),
             "mean": float(np.abs(m).mean())} for rule, m in moves.items()]


def coverage(rows: list[dict[str, Any]]) -> str:
    """'coverage (each set weighs 1), median width' of the rows with an interval, or '–'."""
    s = rf.summary(rows, "covered_draws", "width_draws")
    return f"{100 * s['coverage']:.0f}%, {100 * s['median_width']:.1f}%" if s["n"] else "–"


# The forms of the interval's calibrated term tried (docs/fitting.md): name -> (the pair's lever for prefix p, whether
# the noise term stays beside it). The shipped one first.
FORMS: dict[str, tuple[Any, bool]] = {
    "q·σ_scatter·lev (shipped)": (lambda r, p: r[f"{p}lever"], True),
    "q·x/span (the loss's)": (lambda r, p: max(r[f"{p}lever_span"], 1e-9), True),
    "q (a constant)": (lambda r, p: 1.0, True),
    "q × the noise term": (lambda r, p: r[f"{p}noise_half"], False),
}


CANNOT = 1e9  # the score of a pair a form cannot cover (its lever is 0: e.g. no noise term to scale)


def calibrate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The constant of each form (FORMS) over the shipped rule's N_opt pairs, each set weighing 1
    (`backtest.conformal_multiplier`), and out of sample: each source's from the other sources' pairs
    (`backtest.leave_group_out`), applied to its N_opt and D_opt pairs; adds "{p}covered_out", "{p}width_out" (and
    per form "{p}covered:FORM", "{p}width:FORM"); returns {form: {"q", "q_out": (min, max)}}."""
    sel = [r for r in rows if "lever" in r]
    weights, sources = rf.set_weights(sel), [r["source"] for r in sel]
    out = {}
    for form, (lever, with_noise) in FORMS.items():
        fixed = (lambda r, p: np.hypot(r[f"{p}noise_half"], r[f"{p}obs_half"])) if with_noise else (
            lambda r, p: r[f"{p}obs_half"])
        with np.errstate(divide="ignore"):  # (a pair a form cannot cover at any finite q: a score of CANNOT)
            scores = [min(backtest.needed_spread(r["error"], fixed(r, ""), lever(r, "")), CANNOT) for r in sel]
        out[form] = {"q": backtest.conformal_multiplier(scores, weights=weights), "q_out": None}
        if len(set(sources)) < 2:  # no other source to calibrate on
            continue
        q_N = backtest.leave_group_out(scores, sources, weights=weights)
        out[form]["q_out"] = (min(q_N), max(q_N))
        for r, q in zip(sel, q_N):
            for p, err in (("", r["error"]), ("tokens_", r["error_tokens"])):
                if f"{p}lever" not in r:
                    continue
                pred = np.hypot(r[f"{p}noise_half"], q * lever(r, p)) if with_noise else q * lever(r, p)
                r[f"{p}covered:{form}"] = bool(abs(err) <= np.hypot(pred, r[f"{p}obs_half"]))
                r[f"{p}width:{form}"] = float(2 * np.sinh(pred))
    shipped_form = next(iter(FORMS))
    for r in sel:
        for p in ("", "tokens_"):
            if f"{p}covered:{shipped_form}" in r:
                r[f"{p}covered_out"], r[f"{p}width_out"] = r[f"{p}covered:{shipped_form}"], r[f"{p}width:{shipped_form}"]
    return out


def _cell(rows: list[dict[str, Any]], covered: str, width: str | None) -> str:
    """'coverage (each set weighs 1)[, median width]' over the rows that have `covered`, or '–'."""
    sel = [r for r in rows if covered in r]
    if not sel:
        return "–"
    w = rf.set_weights(sel)
    cov = f"{100 * np.sum(w * [r[covered] for r in sel]) / w.sum():.0f}%"
    return cov + (f", {100 * np.median([r[width] for r in sel]):.0f}%" if width else "")


def interval_lines(rows: list[dict[str, Any]], forms: dict[str, Any]) -> list[str]:
    """The N_opt / D_opt intervals before and after, per family and regime (Markdown), and the forms compared."""
    groups = [("Porian et al. (15)", lambda r: r["family"] == "Porian"), ("other 6", lambda r: r["family"] != "Porian"),
              ("all", lambda r: True)]
    lines = [f"N_opt / D_opt 95% intervals, leave-future-out (the shipped rule, {allocation.SHIPPED}): coverage (each set weighs 1), median width "
             "(hi − lo) / N̂; 'fair': the observed minimum's own noise (1.96 × its sd) in quadrature",
             "| quantity | family | regime | pairs | median \\|error\\| | before: strict | before: fair | "
             "after (shipped q): fair | after, out of sample: fair |", "|---|---|---|---|---|---|---|---|---|"]
    for quantity, p, err in (("N_opt", "", "error"), ("D_opt", "tokens_", "error_tokens")):
        for fam, in_fam in groups:
            for regime, in_regime in rf.SHOWN:
                sel = [r for r in rows if f"{p}lever" in r and in_fam(r) and in_regime(r)]
                if not sel:
                    continue
                e = np.median(np.abs([r[err] for r in sel]))
                lines.append(f"| {quantity} | {fam} | {regime} | {len(sel)} | {100 * e:.1f}% | "
                             f"{_cell(sel, f'{p}covered_before', f'{p}width_before')} | "
                             f"{_cell(sel, f'{p}covered_before_fair', None)} | {_cell(sel, f'{p}covered', f'{p}width')} | "
                             f"{_cell(sel, f'{p}covered_out', f'{p}width_out')} |")
    lines += ["", "Forms of the calibrated term (N_opt, out of sample, fair): coverage, median width per regime",
              "| form | q (all pairs) | q out of sample | family | " + " | ".join(g for g, _ in rf.SHOWN) + " |",
              "|---|---|---|---|" + "---|" * len(rf.SHOWN)]
    for form, f in forms.items():
        for fam, in_fam in groups:
            q_out = f"{f['q_out'][0]:.3f}–{f['q_out'][1]:.3f}" if f["q_out"] else "–"
            lines.append(f"| {form} | {f['q']:.3f} | {q_out} | {fam} | " + " | ".join(
                _cell([r for r in rows if in_fam(r) and in_regime(r)], f"covered:{form}", f"width:{form}")
                for _, in_regime in rf.SHOWN) + " |")
    return lines


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
    forms = calibrate(by_rule[allocation.SHIPPED])
    lines += [""] + interval_lines(by_rule[allocation.SHIPPED], forms)
    result = {"pairs": rows, "picked": nested["picked"], "stability": stab, "interval_forms": forms,
              "criterion": {rule: rf.criterion(rs) for rule, rs in by_rule.items()}}
    return result, lines
