"""The compute-optimal allocation a prediction gives, N_opt(C) = N_coef·C^a and D_opt(C) = D_coef·C^b, and its 95%
intervals.

The law (`law`, RULE): the geometric mean of approach 2's power laws through the per-budget minima and approach 3's
N_opt = G·(C/6)^a, D_opt = (C/6)^b / G — itself a power law, exponent the mean of the two and coefficient their
geometric mean; approach 2's alone where approach 3 gives no allocation. Each rule leads on different published
sets (approach 2 on Porian et al.'s settings, approach 3 on the Chinchilla extractions); out of sample their mean
predicted later budgets' minima better than either (docs/fitting.md, "The compute-optimal allocation: rules
compared"; the other rules live in experiments/allocation_rules.py). Its noise draws (`law_draws`) pair approach
2's draw k with approach 3's draw k (approach 3's point values where it has no draws, as the frontier's E).

Legend: B = budget minima, K = noise draws.

N̂·exp(±h), h = sqrt((Z·σ_noise)² + (q·σ_scatter·lev)²) (`interval`), the same for D̂ with its own σs:
- σ_noise: the sd of ln N̂ at C over the loss-noise draws (each draw refits the law through its resampled minima);
- σ_scatter: how far the minima scatter about the power law: the log residual RMS of the law through them (B − 2
  degrees of freedom), never less than their own noise (the median over budgets of the sd of ln N_opt over the
  draws; `backtest.median_log_sd`). A law through the minima of tuned runs scatters about as the noise says; one through
  digitised or untuned minima scatters further, and the noise draws alone miss it;
- lev = sqrt(1/B + (ln C − mean ln C_opt)² / Σ(ln C_opt − mean)²): how a scatter of σ_scatter per minimum moves a
  least-squares line at C (the leverage of ordinary regression: ≥ 1/√B inside the data, growing with the distance
  beyond it in units of the minima's spread);
- q = ALLOCATION_SPREAD, one constant: the split-conformal 95% quantile of the score each leave-future-out pair of
  the published IsoFLOP sets needs, each set weighing 1 (`backtest.conformal_multiplier`), the pair's observed
  minimum counted with its own noise (`experiments.reproduce_allocation`; docs/fitting.md).

The interval is for the compute-optimal N at C; a minimum observed there scatters about it by its own noise too.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from transformer.scaling import backtest, interval

# The allocation's interval constant q (module docstring): the conformal 95% quantile of the scores of the
# leave-future-out pairs of the published sets (experiments.reproduce_allocation), rounded up: 3.522 for the mean of
# approaches 2 and 3 (its noise draws, approach 3's point values in the reproduction's route, are narrower than
# approach 2's alone, whose q was 3.1).
ALLOCATION_SPREAD = 3.6
SPREAD_FROM = ("95% quantile of the score each leave-future-out pair of 21 published IsoFLOP sets needs (Porian et al. "
               "2024's 15 settings, Chinchilla (Epoch AI's extraction), Open-Athena's ml_scalefit, epochai_chinchilla, "
               "misfitting and Llama 3 raw/exp), each later budget's minimum counted with its own noise; "
               "docs/fitting.md")
QUANTITIES = (("params", "N_opt", "N_coef", "a"), ("tokens", "D_opt", "D_coef", "b"))  # (key, minima, coef, exponent)
KEYS = ("a", "b", "N_coef", "D_coef")  # the power laws N_coef·C^a, D_coef·C^b (approaches 2's, 3's, `law`'s)
# The rule `law` applies, by name: fit.json's frontier "allocation" and "sensitivity" record it, and the rules'
# harness (experiments/allocation_rules.py) knows the shipped rule by it
RULE = "mean of approaches 2 and 3"


def _usable(law: dict[str, Any]) -> bool:
    """Whether `law` has finite power laws with positive coefficients."""
    values = [law.get(k) for k in KEYS]
    return all(v is not None and np.isfinite(v) for v in values) and law["N_coef"] > 0 and law["D_coef"] > 0


def mean(law2: dict[str, Any], law3: dict[str, Any]) -> dict[str, Any]:
    """The geometric mean of two power-law allocations (floats or arrays (K,)): exponents averaged, coefficients
    multiplied under a square root."""
    with np.errstate(invalid="ignore"):
        return {"a": (np.asarray(law2["a"]) + law3["a"]) / 2, "b": (np.asarray(law2["b"]) + law3["b"]) / 2,
                "N_coef": np.sqrt(np.asarray(law2["N_coef"]) * law3["N_coef"]),
                "D_coef": np.sqrt(np.asarray(law2["D_coef"]) * law3["D_coef"])}


def law(approach2: dict[str, Any], approach3: dict[str, Any]) -> dict[str, Any] | None:
    """The allocation a prediction uses (module docstring): {"a", "b", "N_coef", "D_coef", "rule", "from"}; None
    where approach 2 has no power law."""
    if approach2.get("a") is None:
        return None
    if not _usable(approach3):
        return {**{k: float(approach2[k]) for k in KEYS}, "rule": RULE,
                "from": "approach 2 alone (approach 3 gives no allocation)"}
    return {**{k: float(v) for k, v in mean(approach2, approach3).items()}, "rule": RULE,
            "from": "approaches 2 and 3"}


def law_draws(draws2: dict[str, np.ndarray], approach3: dict[str, Any]) -> dict[str, np.ndarray]:
    """`law` per noise draw, (K,) each: approach 2's draw k (`draws2`) with approach 3's draw k, or its point values
    where that draw failed or approach 3 has no draws (`interval.draws_or_point`); approach 2's draws alone where
    approach 3 gives no allocation."""
    two = {k: np.asarray(draws2[k], float) for k in KEYS}
    if not _usable(approach3):
        return two
    return mean(two, interval.draws_or_point(approach3, KEYS, two["a"].size))


def shared_terms(approach2: dict[str, Any], draws2: dict[str, np.ndarray] | None) -> dict[str, Any] | None:
    """What every allocation interval of a fit shares (fit.json's frontier "allocation_interval"): the minima's
    ln C_opt mean and spread, and per quantity ("params", "tokens") the scatter σ_scatter and where it came from.
    None where approach 2 has no power law."""
    budgets = approach2.get("budgets", [])
    if approach2.get("a") is None or len(budgets) < 2:
        return None
    log_c_B = np.log([b["C_opt"] for b in budgets])
    out: dict[str, Any] = {"form": "N̂·exp(±sqrt((1.96·σ_noise)² + (q·σ_scatter·lev)²)), lev = sqrt(1/B + "
                                   "(ln C − mean ln C_opt)² / Σ(ln C_opt − mean)²)", "minima": len(budgets),
                           "log_flops_mean": float(log_c_B.mean()),
                           "log_flops_sum_squares": float(np.sum((log_c_B - log_c_B.mean()) ** 2)),
                           "spread": ALLOCATION_SPREAD, "spread_from": SPREAD_FROM}
    for key, minima, coef, exponent in QUANTITIES:
        y_B = np.log([b[minima] for b in budgets])
        dof = len(budgets) - 2
        rss = float(np.sum((y_B - np.log(approach2[coef]) - approach2[exponent] * log_c_B) ** 2))
        residual = interval.residual_sd(float(np.sqrt(rss / dof)) if dof > 0 else None, dof)
        noise = backtest.median_log_sd(draws2[minima]) if draws2 is not None else None
        found = [(v, name) for v, name in ((residual, "the minima's log residual RMS about the power law"),
                                           (noise, "the minima's own noise (sd of ln over the draws)"))
                 if v is not None]
        sd, source = max(found) if found else (None, "no residual degrees of freedom and no noise draws")
        out[key] = {"residual_sd_log": residual, "minima_noise_sd_log": noise, "scatter_sd_log": sd,
                    "scatter_from": source}
    return out


def leverage(flops: float, shared: dict[str, Any]) -> float:
    """sqrt(1/B + (ln C − mean ln C_opt)² / Σ(ln C_opt − mean)²) at compute `flops` (`shared_terms`)."""
    return float(np.sqrt(1 / shared["minima"] + (np.log(flops) - shared["log_flops_mean"]) ** 2
                         / shared["log_flops_sum_squares"]))


def interval_at(value: float, flops: float, noise_sd: float | None, source: str, shared: dict[str, Any], key: str,
                spread: float | None = None) -> tuple[interval.Interval, dict[str, Any]]:
    """The 95% interval of the predicted `key` ("params" or "tokens") `value` at compute `flops`: value·exp(±h)
    (module docstring), `noise_sd` the sd of its log over the noise draws from `source` (None: no noise term),
    `shared` from `shared_terms`, q = `spread` (None: ALLOCATION_SPREAD). Returns it and its terms (fit.json's
    `params_interval` / `tokens_interval`): each term's half-width in logs, the inputs, where q came from."""
    spread = ALLOCATION_SPREAD if spread is None else float(spread)
    scatter, lev = shared[key]["scatter_sd_log"], leverage(flops, shared)
    scatter_half = spread * scatter * lev if scatter is not None else 0.0
    ci, noise_sd, source, noise_half, half = backtest.log_interval(value, noise_sd, source, scatter_half, "scatter")
    return ci, {"method": "ln v ± sqrt((1.96·σ_noise)² + (q·σ_scatter·lev)²)",
                "half_width_log": half if ci.exists else None, "noise_half_width_log": noise_half,
                "scatter_half_width_log": scatter_half, "noise_sd_log": noise_sd, "source": source,
                "scatter_sd_log": scatter, "scatter_from": shared[key]["scatter_from"], "leverage": lev,
                "spread": spread, "spread_from": SPREAD_FROM if spread == ALLOCATION_SPREAD else "given",
                "calibrated": ci.exists}
