"""What N and C mean: the counting conventions a fit can use, side by side.

Legend: P = points.

Every convention takes C = 6·N·D with its own N, so that Approach 3's a = β/(α+β) (which assumes
C = 6·N·D) and Approach 2's a (N_opt against C) measure the same thing:
- `eff`: N_eff = FLOPs/(6·D), C = the FLOPs as measured (sweeps: attention counted) or given (CSV).
- `eff_no_attention`: the same with the attention-score FLOPs left out (sweeps with shape keys).
- `total`: N = all parameters, embeddings included (sweeps).
- `non_embedding`: N without the token and position tables, as Kaplan et al. 2020 (sweeps).
- `unpadded`: N = all parameters without the vocabulary's padding rows (sweeps whose runs record it): the
  tokenizer's vocabulary is padded to a multiple of 128 (bytes: 259 → 384 ids), and the rows no token id
  uses are 16% of N at d16 and 3% at d160, which tilts a fit of total N (`transformer.spec.accounting.padding_params`).
- `as_given`: N from a CSV's params column (CSVs).
The headline is `eff` where the points have it: its C is the compute the sweep's budgets are made of,
and its N does not swing with the share of embeddings, which is 65% of N at the smallest models of
the `cpu` sweep and 10% at the largest (total vs non-embedding N moved a from 0.55 to 1.18 there).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from transformer.spec import ConfigError
from transformer.scaling import isoflop
from transformer.scaling.points import Points

DESCRIPTIONS = {
    "eff": "N_eff = FLOPs/(6·D), C = the training FLOPs (attention counted where measured)",
    "eff_no_attention": "N_eff = FLOPs/(6·D), C = the training FLOPs without the attention scores",
    "total": "N = all parameters (embeddings included), C = 6·N·D",
    "non_embedding": "N = parameters without the embedding tables (Kaplan et al.), C = 6·N·D",
    "as_given": "N = the CSV's params column, C = 6·N·D",
    "unpadded": "N = all parameters without the vocabulary's padding rows (ids no token uses), C = 6·N·D",
}
HEADLINE_WHY = {
    "eff": ("N_eff = FLOPs/(6·D): C is the compute the budgets are made of, so approaches 2 and 3 use one "
            "C(N, D), and N does not swing with the embedding share of small models"),
    "as_given": "the CSV's own N (it gives no other counts)",
}


def available(points: Points) -> list[str]:
    """The conventions the points support, the headline first."""
    if not points.extra_P:  # a CSV or arrays: its params, and its flops when they differ from 6·N·D
        differs = not np.allclose(points.flops_P, 6.0 * points.params_P * points.tokens_P, rtol=1e-3)
        return ["eff", "as_given"] if differs else ["as_given"]
    names = ["eff"]
    if "flops_no_attention" in points.extra_P:
        names.append("eff_no_attention")
    names += [k for k, key in (("total", "params_total"), ("non_embedding", "params_non_embedding"),
                               ("unpadded", "params_unpadded")) if key in points.extra_P]
    return names


def n_of(points: Points, name: str) -> np.ndarray:
    """N under convention `name`, (P,)."""
    if name == "eff":
        return points.flops_P / (6.0 * points.tokens_P)
    if name == "eff_no_attention":
        return points.extra_P["flops_no_attention"] / (6.0 * points.tokens_P)
    if name == "total":
        return points.extra_P["params_total"]
    if name == "non_embedding":
        return points.extra_P["params_non_embedding"]
    if name == "as_given":
        return points.params_P
    if name == "unpadded":
        return points.extra_P["params_unpadded"]
    raise ConfigError(f"convention={name!r} is not valid; choose one of {', '.join(DESCRIPTIONS)}")


def apply(points: Points, name: str) -> Points:
    """The points with N and C = 6·N·D of convention `name`. Budgets stay those of the original compute
    (the designed budget, or the FLOPs grouped within 1%); loss curves are rescaled to match."""
    if name not in available(points):
        raise ConfigError(f"convention={name!r} is not available for {points.source}; "
                         f"available: {', '.join(available(points))}")
    budget_P = points.budget_P
    if budget_P is None:
        budget_P = np.zeros(len(points))
        for idx in isoflop.group_budgets(points.flops_P):
            budget_P[idx] = np.exp(np.mean(np.log(points.flops_P[idx])))
    n_P = n_of(points, name)
    flops_P = 6.0 * n_P * points.tokens_P
    by_id = {i: (n, c / c0) for i, n, c, c0 in zip(points.ids, n_P, flops_P, points.flops_P)}
    curves = tuple(dataclasses.replace(cv, params=by_id[cv.run_id][0], flops_S=cv.flops_S * by_id[cv.run_id][1])
                   for cv in points.curves if cv.run_id in by_id)
    return dataclasses.replace(points, params_P=n_P, flops_P=flops_P, budget_P=budget_P, curves=curves)
