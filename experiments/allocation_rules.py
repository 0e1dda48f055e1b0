"""The rules for the compute-optimal allocation N_opt(C) = N_coef·C^a, D_opt(C) = D_coef·C^b compared by the
leave-future-out backtests and the leave-one-budget-out stability of `experiments.reproduce_allocation`
(docs/fitting.md "The compute-optimal allocation: rules compared"). The mean of approaches 2 and 3 beat every
other out of sample, so the product ships it (`transformer.scaling.allocation.law`, `allocation.RULE`); the
others live here, on the experiments side, for the reproduction.

Legend: B = budget minima, K = noise draws, Q = prediction budgets.

- "approach 2": both power laws fitted through approach 2's per-budget minima (slope and coefficient). A handful
  of minima hardly pin the slope: dropping one of Chinchilla's five moves N_opt at 4× the largest budget by 58%.
- "held (χ² test)": the exponents held at approach 3's, a = β/(α+β) and b = α/(α+β) (fitted to every point near an
  optimum, hundreds rather than a handful), only the coefficients fitted through the minima (least squares in
  ln N and ln D: the mean of ln N − a·ln C), unless the minima reject the held a: (RSS_held − RSS_free) / σ² >
  A_TEST, RSS the squared ln N residuals about each law and σ the minima's own noise (the median over budgets of
  the sd of ln N_opt over the loss-noise draws; without draws the free law's residual sd, where it has residual
  degrees of freedom; with neither the exponent is held). The same kind of test as the frontier's E
  (`frontier.choose`).
- "held always": the held laws without the test.
- "approach 3": approach 3's own N_opt = G·(C/6)^a, D_opt = (C/6)^b / G (`parametric.LossFit.n_opt`), its
  coefficient from the fitted form rather than the minima.
- "mean of approaches 2 and 3" (shipped, `allocation.law`): the geometric mean of approach 2's and approach 3's N_opt (and D_opt), itself a
  power law (exponent the mean of the two, coefficient their geometric mean): the two rules lead on different sets.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from transformer.scaling import allocation, backtest, frontier, interval, isoflop, refits
from transformer.scaling.points import Points

# The χ²(1) 95% quantile, as for the frontier's E: approach 3's exponent is rejected when it raises the RSS of ln N_opt
# by more (× σ²)
A_TEST = frontier.E_TEST
SHIPPED = allocation.RULE  # the rule the product ships (`allocation.law`: it won out of sample)
RULES = ("approach 2", "held (χ² test)", "held always", "approach 3", SHIPPED)
KEYS = allocation.KEYS


def held_laws(flops_BK: np.ndarray, n_BK: np.ndarray, d_BK: np.ndarray, a: float, b: float) -> dict[str, np.ndarray]:
    """The power laws with exponents a, b held, coefficients fitted (least squares in logs) per column: each (K,)."""
    log_c_BK = np.log(flops_BK)
    with np.errstate(over="ignore"):
        return {"a": np.full(log_c_BK.shape[1], a), "b": np.full(log_c_BK.shape[1], b),
                "N_coef": np.exp(np.mean(np.log(n_BK) - a * log_c_BK, axis=0)),
                "D_coef": np.exp(np.mean(np.log(d_BK) - b * log_c_BK, axis=0))}


def test(flops_B: np.ndarray, n_B: np.ndarray, a_held: float, noise_sd: float | None) -> dict[str, Any]:
    """The χ² test of the held exponent against the minima (module docstring): {"held": bool, ...the terms}."""
    x_B, y_B = np.log(np.asarray(flops_B, float)), np.log(np.asarray(n_B, float))
    a_free, k_free = np.polyfit(x_B, y_B, 1)
    rss_free = float(np.sum((y_B - a_free * x_B - k_free) ** 2))
    rss_held = float(np.sum((y_B - a_held * x_B - np.mean(y_B - a_held * x_B)) ** 2))
    sd, sd_from = noise_sd, "the minima's noise draws (sd of ln N_opt)"
    if not (sd and np.isfinite(sd) and sd > 0):
        dof = len(x_B) - 2
        sd = interval.residual_sd(float(np.sqrt(rss_free / dof)) if dof > 0 else None, dof)
        sd_from = "the free law's residual sd"
    out: dict[str, Any] = {"a_free": float(a_free), "a_approach3": float(a_held), "rss_free": rss_free,
                           "rss_held": rss_held, "threshold": A_TEST,
                           "rule": "approach 3's exponent is held unless (RSS_held − RSS_free) / σ² > the χ²(1) 95% "
                                   "quantile (RSS of ln N_opt about each law through the minima)"}
    if sd is None:
        return {**out, "held": True, "statistic": None, "noise_sd": None,
                "noise_sd_from": "no noise draws and no residual degrees of freedom: held"}
    statistic = (rss_held - rss_free) / sd**2
    return {**out, "held": bool(statistic <= A_TEST), "statistic": float(statistic), "noise_sd": float(sd),
            "noise_sd_from": sd_from}


def decide(flops_B: np.ndarray, n_B: np.ndarray, d_B: np.ndarray, approach3: dict[str, Any], noise_sd: float | None,
           rule: str) -> tuple[dict[str, Any], str]:
    """The allocation under `rule` through the minima (C_opt, N_opt, D_opt), each (B,), B ≥ 2:
    ({"a", "b", "N_coef", "D_coef", "rule", "N_opt_from", "test"}, which law: "approach 2" | "held" | "approach 3"
    | "mean").
    `approach3`: its "a", "b", "N_coef", "D_coef" (a rule that needs them where approach 3 has none falls back on
    approach 2's laws and says so); `noise_sd`: the minima's sd of ln N_opt (`backtest.median_log_sd`; None: see `test`)."""
    if rule not in RULES:
        raise ValueError(f"unknown allocation rule {rule!r}; one of {RULES}")
    c_B1, n_B1, d_B1 = (np.asarray(v, float).reshape(-1, 1) for v in (flops_B, n_B, d_B))
    record: dict[str, Any] = {"rule": rule, "form": "N_opt = N_coef·C^a, D_opt = D_coef·C^b"}
    free = {k: float(v[0]) for k, v in isoflop.power_laws(c_B1, n_B1, d_B1).items()}
    from_minima = {**free, **record, "N_opt_from": "approach 2 (power laws through the minima)", "test": None}
    if rule == "approach 2":
        return from_minima, "approach 2"
    if approach3.get("a") is None:
        return {**from_minima, "test": "approach 3 gives no exponent to hold"}, "approach 2"
    if rule == "approach 3":
        return ({**{k: float(approach3[k]) for k in KEYS}, **record, "N_opt_from": "approach 3 (N_opt = G·(C/6)^a)",
                 "test": None}, "approach 3")
    if rule == SHIPPED:
        return ({**allocation.law(free, approach3), **record, "N_opt_from": "the geometric mean of approaches 2 and 3",
                 "test": None}, "mean")
    verdict = test(c_B1[:, 0], n_B1[:, 0], approach3["a"], noise_sd)
    if rule == "held (χ² test)" and not verdict["held"]:
        return {**from_minima, "N_opt_from": "approach 2 (the minima reject approach 3's exponent)",
                "test": verdict}, "approach 2"
    held = {k: float(v[0]) for k, v in held_laws(c_B1, n_B1, d_B1, approach3["a"], approach3["b"]).items()}
    return {**held, **record, "N_opt_from": "approach 3's exponent, coefficients through the minima",
            "test": verdict}, "held"


def choose(approach2: dict[str, Any], approach3: dict[str, Any], draws2: dict[str, np.ndarray] | None,
           rule: str) -> tuple[dict[str, Any] | None, dict[str, np.ndarray] | None]:
    """`decide` through approach 2's minima, σ from its noise draws `draws2` (`backtest.median_log_sd`, stored as the law's
    "minima_noise_sd"), and the allocation's
    draws {"a", "b", "N_coef", "D_coef"} each (K,): approach 2's, or the held laws refitted through each draw's
    minima (the exponents held in every draw); None without draws or under "approach 3" (this route has no
    approach-3 draws). (None, None) where approach 2 has no power law."""
    if approach2.get("a") is None:
        return None, None
    budgets = approach2["budgets"]
    c_B, n_B, d_B = (np.array([b[key] for b in budgets], float) for key in ("C_opt", "N_opt", "D_opt"))
    noise_sd = backtest.median_log_sd(draws2["N_opt"]) if draws2 is not None else None
    law, which = decide(c_B, n_B, d_B, approach3, noise_sd, rule)
    law["minima_noise_sd"] = noise_sd
    if draws2 is None or which == "approach 3":
        return law, None
    if which == "approach 2":
        return law, {k: draws2[k] for k in KEYS}
    if which == "mean":
        return law, allocation.law_draws(draws2, approach3)
    return law, held_laws(draws2["C_opt"], draws2["N_opt"], draws2["D_opt"], law["a"], law["b"])


def at(law: dict[str, Any], flops: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """(N_opt, D_opt) at compute `flops` under a law or its draws (arrays broadcast)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return (np.asarray(law["N_coef"]) * np.power(flops, law["a"]),
                np.asarray(law["D_coef"]) * np.power(flops, law["b"]))


def refit_allocations(points: Points, approach2: dict[str, Any], approach3: dict[str, Any]) -> list[dict[str, Any]]:
    """Approach 3 refitted with each budget's points dropped in turn (`refits.approach3_fits`, as leave-one-budget-out
    does): per budget `refits.allocation_of` ({"E", "a", "b", "N_coef", "D_coef"}, None where it has none)."""
    return [refits.allocation_of(f)
            for f in refits.approach3_fits(points, approach3, refits.drop_each(points, approach2), warm=True)]


def moves(points: Points, approach2: dict[str, Any], approach3: dict[str, Any], noise_sd: float | None,
          flops_Q: Sequence[float], rules: Sequence[str] = RULES,
          refits_B: list[dict[str, float | None]] | None = None) -> dict[str, np.ndarray]:
    """For each rule (`decide`), N_opt at `flops_Q` with each budget dropped in turn (its minimum, and its points
    from approach 3: `refits_B`, `refit_allocations` computed here when None) / N_opt from every budget − 1:
    {rule: (B, Q)}. `noise_sd`: the full fit's sd of ln N_opt of one minimum (the test's σ in every refit)."""
    budgets = approach2["budgets"]
    c_B, n_B, d_B = (np.array([b[k] for b in budgets], float) for k in ("C_opt", "N_opt", "D_opt"))
    if refits_B is None:
        refits_B = refit_allocations(points, approach2, approach3)
    flops_Q = np.asarray(flops_Q, float)
    out = {}
    for rule in rules:
        full = at(decide(c_B, n_B, d_B, approach3, noise_sd, rule)[0], flops_Q)[0]
        rows = []
        for i, a3_i in enumerate(refits_B):
            keep = np.arange(len(budgets)) != i
            law, _ = decide(c_B[keep], n_B[keep], d_B[keep], a3_i, noise_sd, rule)
            rows.append(at(law, flops_Q)[0] / full - 1)
        out[rule] = np.array(rows)
    return out
