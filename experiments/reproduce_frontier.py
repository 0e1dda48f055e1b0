"""Leave-future-out backtests of the loss frontier on published IsoFLOP sets, for `experiments.reproduce`.

For every set and every origin C (each budget in turn), the frontier is fitted on the points of the budgets up to
C alone (`predict.frontier_predictions`, the route `fits.fit_all` takes) and predicts the optimal loss of every later
budget that has a minimum; the truth is that budget's own minimum. A pair's regime is its extrapolation factor
C_target / C: "<4x" or "≥4x". The two cases of the older table ("2x": the largest budget from every budget below
it; "4x": from those ≤ 1/4 of it) are the pairs with the largest target and those two origins.

The interval's constant q (`backtest.FRONTIER_SPREAD`) is calibrated on these pairs: a pair's score is the q that its
interval needs to cover the truth (`backtest.needed_spread`: 0 where |e| ≤ Z·σ_noise, else |e| / (x/span)); each
set's pairs weigh 1 in all (`backtest.conformal_multiplier` with weights), and out of sample each data source's q
comes from the other sources' pairs alone (`backtest.leave_group_out`).
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import numpy as np

from transformer.scaling import backtest, frontier, isoflop, predict
from transformer.scaling import points as points_lib

FAR = 4 * 0.99  # a pair extrapolating this factor or more beyond its origin is in the "≥4x" regime
REGIMES: tuple[tuple[str, Callable[[dict[str, Any]], bool]], ...] = (
    ("<4x", lambda r: r["ratio"] < FAR), ("≥4x", lambda r: r["ratio"] >= FAR))
# The tables also show the pairs 4–16x beyond their origin (the ≥4x regime without the far extrapolations from two
# or three minima, 16x to 1000x).
SHOWN = REGIMES + (("4–16x", lambda r: FAR <= r["ratio"] < 16 * 0.99),)
# The rules for E compared: (`frontier.E_TEST` set to a threshold, the held law's weight as a function of the test
# statistic). ∓inf always frees / holds E; the hard χ² test (the rule before) gives the chosen law all the weight;
# the soft test (shipped) averages the two laws (`frontier.held_weight`). getattr: the harness also runs on the code
# before.
_SHIPPED_TEST = getattr(frontier, "E_TEST", None)
RULES: dict[str, tuple[float | None, Callable[[float], float] | None]] = {
    "free E (before)": (float("-inf"), None), "E held at approach 3's": (float("inf"), None),
    "χ² test (hard, before)": (_SHIPPED_TEST, lambda statistic: float(statistic <= frontier.E_TEST)),
    "soft test (shipped)": (_SHIPPED_TEST, None)}
SHIPPED = "soft test (shipped)"


@contextlib.contextmanager
def rule(name: str) -> Iterator[None]:
    """`frontier` set to the rule `name` of RULES for the block, then restored."""
    threshold, weight = RULES[name]
    saved = frontier.E_TEST, getattr(frontier, "held_weight", None)
    frontier.E_TEST = threshold
    if weight is not None:
        frontier.held_weight = weight
    try:
        yield
    finally:
        frontier.E_TEST = saved[0]
        if saved[1] is not None:
            frontier.held_weight = saved[1]


def origins(pts: points_lib.Points) -> Iterator[tuple[float, points_lib.Points, list[dict[str, Any]], int]]:
    """(C, the points of the budgets ≤ C, the later budgets with a minimum, the minima up to C) for each origin C that
    leaves a later minimum: every budget with a minimum, and the largest budget ≤ 1/4 of the largest minimum's (the
    older table's "4x" case; a digitised grid's compute values scatter, so not every value is a budget)."""
    a2 = isoflop.approach2(pts)
    groups = isoflop.group_budgets(pts.flops_P, budget_P=pts.budget_P)
    group_P = np.empty(len(pts), float)
    for g in groups:
        group_P[g] = np.exp(np.mean(np.log(pts.flops_P[g])))
    top = max((b["flops"] for b in a2["budgets"]), default=0.0)
    quarter = [c for c in np.unique(group_P) if c <= top / 4 * (1 + isoflop.BUDGET_RTOL)]
    for c in sorted({b["flops"] for b in a2["budgets"]} | set(quarter[-1:])):
        later = sorted((b for b in a2["budgets"] if b["flops"] > c * (1 + isoflop.BUDGET_RTOL)), key=lambda b: b["flops"])
        if later:
            yield float(c), pts.subset(group_P <= c * (1 + 1e-9)), later, len(a2["budgets"]) - len(later)


def lfo(name: str, pts: points_lib.Points, samples: int) -> list[dict[str, Any]]:
    """One record per (origin, later budget) of `name` whose prediction has a loss: {"data", "origin", "minima",
    "flops", "ratio", "truth", "predicted", "error" (ln L̂/L), "E_from", and where there is an interval "ci95",
    "covered", "width" ((hi − lo) / L̂), and where it has them (this version) "noise_half", "lever", "score"}. Reads
    only what every version of `predict.frontier_predictions` writes, besides those optional terms, so that the
    same harness measures the code before."""
    rows = []
    for c, sub, later, minima in origins(pts.canonical()):
        out = predict.frontier_predictions(sub, [b["flops"] for b in later], samples)
        for b, p in zip(later, out["predictions"]):
            if p.get("loss") is None:
                continue
            rec: dict[str, Any] = {"data": name, "origin": c, "minima": minima, "flops": b["flops"],
                                   "ratio": b["flops"] / c, "truth": b["loss_opt"], "predicted": p["loss"],
                                   "error": float(np.log(p["loss"] / b["loss_opt"])),
                                   "E_from": out["frontier"].get("E_from")}
            ci = p.get("loss_ci95")
            if ci and None not in ci:
                rec.update(ci95=ci, covered=bool(ci[0] <= b["loss_opt"] <= ci[1]), width=(ci[1] - ci[0]) / p["loss"])
            cal = p.get("loss_interval") or {}
            if cal.get("lever"):
                noise = cal["noise_half_width_log"]
                rec.update(noise_half=noise, lever=cal["lever"], distance=cal["distance"], span=cal["span"],
                           gamma=cal.get("gamma"),
                           score=backtest.needed_spread(rec["error"], noise, cal["lever"], backtest.FRONTIER_COMBINE))
            rows.append(rec)
    return rows


def headline(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The older table's two cases per set: the largest target predicted from the budget just below it ("2x") and
    from the largest budget ≤ 1/4 of it ("4x")."""
    out = []
    for name in dict.fromkeys(r["data"] for r in rows):
        mine = [r for r in rows if r["data"] == name]
        top = max(r["flops"] for r in mine)
        at_top = [r for r in mine if r["flops"] == top]
        near = max(at_top, key=lambda r: r["origin"])
        far = [r for r in at_top if r["ratio"] >= 4 / (1 + isoflop.BUDGET_RTOL)]
        out += [{**near, "case": "2x"}] + ([{**max(far, key=lambda r: r["origin"]), "case": "4x"}] if far else [])
    return out


def set_weights(rows: list[dict[str, Any]]) -> np.ndarray:
    """1 / (the rows of the same set): each set weighs 1."""
    count = {}
    for r in rows:
        count[r["data"]] = count.get(r["data"], 0) + 1
    return np.array([1.0 / count[r["data"]] for r in rows])


def calibrate(rows: list[dict[str, Any]]) -> float:
    """Adds to each scored row `q_out` (its source's q from the other sources' pairs), `covered_out`, `width_out`;
    returns q over every pair (what FRONTIER_SPREAD rounds up). Each set weighs 1."""
    sel = [r for r in rows if "score" in r]
    scores, weights = [r["score"] for r in sel], set_weights(sel)
    for r, q in zip(sel, backtest.leave_group_out(scores, [r["source"] for r in sel], weights=weights)):
        half = backtest.combine(r["noise_half"], q * r["lever"], backtest.FRONTIER_COMBINE)
        r.update(q_out=q, covered_out=bool(abs(r["error"]) <= half), width_out=float(2 * np.sinh(half)))
    return backtest.conformal_multiplier(scores, weights=weights)


def summary(rows: list[dict[str, Any]], covered: str = "covered", width: str = "width") -> dict[str, Any]:
    """n, sets, coverage (each set weighs 1), median |error|, median width and their ratio, over `rows`."""
    sel = [r for r in rows if covered in r]
    if not sel:
        return {"n": 0}
    w = set_weights(sel)
    e = np.abs([r["error"] for r in sel])
    med_w = float(np.median([r[width] for r in sel]))
    return {"n": len(sel), "sets": len({r["data"] for r in sel}),
            "coverage": float(np.sum(w * [r[covered] for r in sel]) / w.sum()),
            "median_abs_error": float(np.median(e)), "median_width": med_w,
            "width_over_error": med_w / float(np.median(e)) if np.median(e) > 0 else None}


def rule_rows(sets: list[tuple[str, points_lib.Points, dict[str, str]]], samples: int) -> dict[str, list[dict[str, Any]]]:
    """`lfo` of every set (tagged with its "family" and "source") under each rule for E (RULES, set by `rule`)."""
    out = {}
    for name in RULES:
        with rule(name):
            out[name] = [{**r, **tags} for set_name, pts, tags in sets for r in lfo(set_name, pts, samples)]
    return out


def criterion(rows: list[dict[str, Any]]) -> float:
    """What a rule is chosen by: the mean over the two regimes of the median over sets of each set's median
    |error| (each set weighs 1)."""
    per_regime = []
    for _, in_regime in REGIMES:
        sel = [r for r in rows if in_regime(r)]
        per_set = [np.median([abs(r["error"]) for r in sel if r["data"] == d]) for d in dict.fromkeys(r["data"] for r in sel)]
        per_regime.append(float(np.median(per_set)))
    return float(np.mean(per_regime))


def nested_choice(by_rule: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The rule chosen out of sample: for each source, the rule with the lowest `criterion` on the other sources'
    pairs, and that rule's errors on the source's own pairs; the errors of the chosen rules over all sources."""
    sources = list(dict.fromkeys(r["source"] for r in next(iter(by_rule.values()))))
    picked, rows = {}, []
    for s in sources:
        best = min(by_rule, key=lambda name: criterion([r for r in by_rule[name] if r["source"] != s]))
        picked[s] = best
        rows += [r for r in by_rule[best] if r["source"] == s]
    return {"picked": picked, "rows": rows}


def stability(sets: list[tuple[str, points_lib.Points, dict[str, str]]], samples: int) -> list[dict[str, Any]]:
    """Per set, under each rule for E: the frontier fitted on every budget and its forecast where a fit without
    `--predict_flops` makes it (`refits.reference_flops`: 4 × the largest budget's C_opt), and how much that forecast
    (loss and N_opt) moves when any one budget is dropped (`refits.leave_one_budget_out`, fit.json's frontier
    "sensitivity"). Until 2026-11-27 it was 4 × the largest point's compute, which on Epoch AI's Chinchilla
    extraction (one point at 1.3e22, its largest budget's minimum at 9.7e20) asked 53× out, not 4×."""
    out = []
    for name, pts, tags in sets:
        for rule_name in RULES:
            with rule(rule_name):
                sens = predict.frontier_predictions(pts, [], samples)["frontier"].get("sensitivity")
            if sens:
                out.append({"data": name, **tags, "rule": rule_name, "at_flops": sens["at_flops"][0],
                            **{k: sens[k][0] for k in ("loss_max_abs_change", "loss_mean_abs_change",
                                                      "params_max_abs_change", "params_mean_abs_change") if k in sens}})
    return out


# The pairs grouped by the number of minima their refit saw: the lever's span power evens out their coverage
# (docs/fitting.md, "Why span^0.75").
MINIMA: tuple[tuple[str, Callable[[dict[str, Any]], bool]], ...] = (
    ("2–3 minima", lambda r: r["minima"] <= 3), ("4–5 minima", lambda r: 4 <= r["minima"] <= 5),
    ("≥ 6 minima", lambda r: r["minima"] >= 6))
# The pairs ≥ 4x out grouped by their refit's γ (at least backtest.GAMMA_FLOOR): the lever's γ^a evens out their
# coverage (docs/fitting.md, "Why γ in the lever").
GAMMAS: tuple[tuple[str, Callable[[dict[str, Any]], bool]], ...] = tuple(
    (label, lambda r, lo=lo, hi=hi: lo <= (r.get("gamma") or 0.0) < hi)
    for label, lo, hi in (("γ < 0.15", 0.0, 0.15), ("γ 0.15–0.3", 0.15, 0.3), ("γ 0.3–0.5", 0.3, 0.5),
                          ("γ ≥ 0.5", 0.5, np.inf)))
CASES: tuple[tuple[str, Callable[[dict[str, Any]], bool]], ...] = (
    ("2x", lambda r: r.get("case") == "2x"), ("4x", lambda r: r.get("case") == "4x"))


def table(groups: list[tuple[str, list[dict[str, Any]]]], columns: list[tuple[str, str, str]],
          regimes: tuple[tuple[str, Callable[[dict[str, Any]], bool]], ...] = SHOWN) -> list[str]:
    """Markdown: per group and regime (or case), n (sets), median |error|, and per (label, covered key, width key) column the
    coverage, median width and width / median |error|."""
    head = "| data | regime | pairs (sets) | median \\|error\\| | " + " | ".join(
        f"{label}: covers, median width (× error)" for label, _, _ in columns) + " |"
    lines = [head, "|" + "---|" * (4 + len(columns))]
    for group, rows in groups:
        for regime, in_regime in regimes:
            sel = [r for r in rows if in_regime(r)]
            if not sel:
                continue
            cells = []
            for _, cov, wid in columns:
                s = summary(sel, cov, wid)
                cells.append(f"{100 * s['coverage']:.0f}%, {100 * s['median_width']:.2f}% (×{s['width_over_error']:.1f})"
                             if s["n"] else "–")
            e = np.median(np.abs([r["error"] for r in sel]))
            lines.append(f"| {group} | {regime} | {len(sel)} ({len({r['data'] for r in sel})}) | {100 * e:.2f}% | "
                         + " | ".join(cells) + " |")
    return lines


def across_families(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """q calibrated on one family's pairs alone (Porian et al.'s settings, or every other set), applied to the
    other's: per direction, q and the coverage and median width it gives per regime."""
    out = []
    for fam in ("Porian", "other"):
        is_cal = (lambda r: r["family"] == "Porian") if fam == "Porian" else (lambda r: r["family"] != "Porian")
        cal = [r for r in rows if "score" in r and is_cal(r)]
        test = [r for r in rows if "score" in r and not is_cal(r)]
        if not cal or not test:
            continue
        q = backtest.conformal_multiplier([r["score"] for r in cal], weights=set_weights(cal))
        scored = []
        for r in test:
            half = backtest.combine(r["noise_half"], q * r["lever"], backtest.FRONTIER_COMBINE)
            scored.append({**r, "covered_x": bool(abs(r["error"]) <= half), "width_x": float(2 * np.sinh(half))})
        name = "Porian et al. (15 settings)" if fam == "Porian" else f"the other {len({r['data'] for r in cal})} sets"
        out.append({"calibrated_on": name, "q": q,
                    **{regime: summary([r for r in scored if in_regime(r)], "covered_x", "width_x")
                       for regime, in_regime in REGIMES}})
    return out


def run(sets: list[tuple[str, points_lib.Points, dict[str, str]]], samples: int) -> tuple[dict[str, Any], list[str]]:
    """Everything `experiments.reproduce` prints about the frontier, as (JSON-ready results, Markdown lines): the
    leave-future-out pairs under the shipped rule with their interval (shipped q, and out of sample), the older
    table's two cases, q across families, the rules for E compared (and chosen out of sample), the stability."""
    by_rule = rule_rows(sets, samples)
    rows = by_rule[SHIPPED]
    q = calibrate(rows)
    cases = headline(rows)
    cols = [("shipped q", "covered", "width"), ("out of sample", "covered_out", "width_out")]
    groups = lambda rs: [("Porian et al. (15)", [r for r in rs if r["family"] == "Porian"]),  # noqa: E731
                         ("other (Chinchilla, Open-Athena)", [r for r in rs if r["family"] != "Porian"]), ("all", rs)]
    lines = ["Leave-future-out pairs (every origin, every later minimum):"] + table(groups(rows), cols)
    lines += ["", "The two cases per set of the older table:"] + table(groups(cases), cols, CASES)
    lines += ["", "Leave-future-out pairs by the minima their refit saw:"] + table([("all", rows)], cols, MINIMA)
    lines += ["", "Leave-future-out pairs ≥ 4x out by their refit's γ:"] + table(
        [("≥ 4x", [r for r in rows if REGIMES[1][1](r)])], cols, GAMMAS)
    lines += ["", f"q over every pair: {q:.4f} (shipped backtest.FRONTIER_SPREAD {backtest.FRONTIER_SPREAD}); out of "
                  f"sample, each source's from the others: {min(r['q_out'] for r in rows if 'q_out' in r):.4f}–"
                  f"{max(r['q_out'] for r in rows if 'q_out' in r):.4f}"]
    across = across_families(rows)
    for a in across:
        lines.append(f"q from {a['calibrated_on']} alone: {a['q']:.4f}; on the other family: " + "; ".join(
            f"{regime} covers {100 * a[regime]['coverage']:.0f}%, median width {100 * a[regime]['median_width']:.2f}% "
            f"(×{a[regime]['width_over_error']:.1f} the median |error| {100 * a[regime]['median_abs_error']:.2f}%)"
            for regime, _ in REGIMES if a[regime].get("n")))
    nested = nested_choice(by_rule)
    lines += ["", "Rules for E, median |error| per regime (median over sets of each set's median | pooled):",
              "| rule | family | " + " | ".join(f"{regime}" for regime, _ in SHOWN) + " |", "|---|---|" + "---|" * len(SHOWN)]
    for rule_name, rs in list(by_rule.items()) + [("chosen out of sample (per source, on the others)", nested["rows"])]:
        for fam, sel in groups(rs):
            lines.append(f"| {rule_name} | {fam} | " + " | ".join(_errors([r for r in sel if in_regime(r)])
                                                              for _, in_regime in SHOWN) + " |")
    lines.append("picked per source: " + ", ".join(f"{r}: {sum(1 for v in nested['picked'].values() if v == r)}"
                                                   for r in RULES))
    stab = stability(sets, samples)
    lines += ["", "Forecast at 4x the largest budget, leave one budget out: max / mean |change| (loss; N_opt)",
              "| data | " + " | ".join(RULES) + " |", "|---|" + "---|" * len(RULES)]
    for name in dict.fromkeys(s["data"] for s in stab):
        cells = []
        for rule_name in RULES:
            s = next((s for s in stab if s["data"] == name and s["rule"] == rule_name), None)
            cells.append(f"{100 * s['loss_max_abs_change']:.2f} / {100 * s['loss_mean_abs_change']:.2f}%; "
                         f"{100 * s.get('params_max_abs_change', np.nan):.1f} / "
                         f"{100 * s.get('params_mean_abs_change', np.nan):.1f}%"
                         if s else "–")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    result = {"pairs": rows, "cases": cases, "spread": q, "across_families": across, "rules": {
        rule_name: {fam: {regime: _errors([r for r in sel if in_regime(r)]) for regime, in_regime in SHOWN}
                    for fam, sel in groups(rs)} for rule_name, rs in by_rule.items()}, "picked": nested["picked"],
        "stability": stab}
    return result, lines


def _errors(rows: list[dict[str, Any]]) -> str:
    """'median over sets of each set's median |error| | pooled median |error|' (%), or '–'."""
    if not rows:
        return "–"
    per_set = [np.median([abs(r["error"]) for r in rows if r["data"] == d]) for d in dict.fromkeys(r["data"] for r in rows)]
    return f"{100 * np.median(per_set):.2f}% \\| {100 * np.median(np.abs([r['error'] for r in rows])):.2f}%"
