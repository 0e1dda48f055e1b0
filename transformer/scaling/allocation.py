"""The 95% intervals of the compute-optimal allocation a prediction gives: N_opt(C) = N_coef·C^a and
D_opt(C) = D_coef·C^b, approach 2's power laws through the per-budget minima (`refits.ALLOCATION_RULE`).

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
# leave-future-out pairs of the published sets (experiments.reproduce_allocation), rounded up.
ALLOCATION_SPREAD = 3.1
SPREAD_FROM = ("95% quantile of the score each leave-future-out pair of 21 published IsoFLOP sets needs (Porian et al. "
               "2024's 15 settings, Chinchilla (Epoch AI's extraction), Open-Athena's ml_scalefit, epochai_chinchilla, "
               "misfitting and Llama 3 raw/exp), each later budget's minimum counted with its own noise; "
               "docs/fitting.md")
QUANTITIES = (("params", "N_opt", "N_coef", "a"), ("tokens", "D_opt", "D_coef", "b"))  # (key, minima, coef, exponent)
KEYS = ("a", "b", "N_coef", "D_coef")  # the power laws N_coef·C^a, D_coef·C^b (approach 2's and their draws')


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
