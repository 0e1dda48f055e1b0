"""The loss frontier L_opt(C) = E + k·C^(−γ) through the per-budget minima, and predictions at any C.

Legend: B = budgets, K = noise draws, Q = budgets asked for.

The irreducible term E stays in the model: a pure power law through the minima bends the wrong way and
misses the loss at 4× the largest budget by 2–3% (docs, scaling-design notes). The fit is least squares
in ln L (ln L = logaddexp(ln k − γ ln C, ln E)) with 0 < E < min L_opt and γ ≥ 0, from a few starts.

Which minima set the law: the largest FRONTIER_BUDGETS (`fit_largest`). Fitted through every minimum, the
smallest budgets (where the loss still falls steeply and the form bends most) pull E up, and the frontier
over-predicts far out (docs/fitting.md).

Where E comes from (`choose`): approach 3's E (fitted to every point near an optimum, so hundreds of points
rather than a handful of minima) is held, and only k and γ are fitted through the minima, unless the minima
reject it: the held law's residual sum of squares exceeds the free law's by more than E_TEST (the χ² 95% quantile
with one degree of freedom) times the minima's noise variance. A handful of minima hardly identify E (a free fit
through 3–5 of them extrapolated 4–10× beyond the data misses by 4–5% on the Chinchilla sets); where many minima
trace a curve that approach 3's E cannot follow (Porian et al.'s small-scale settings, whose loss carries a term
that fades with compute), the test frees E. docs/fitting.md has the comparison on the published sets.

The predictions average the two laws rather than pick one (`held_weight`, the "soft test"): the held law weighs
1 / (1 + exp((statistic − E_TEST) / 2)), the free one the rest — Akaike's weights with the test's threshold as
the free law's penalty for its extra parameter. The test's choice stays what fit.json's "law" and "E_from" report
(the law weighing more); `loss_at` evaluates the mixture where "weight_held" is present. Near the threshold a hard
choice jumps between two extrapolations; out of sample (leave-future-out pairs of 21 published sets, each data
source's rule chosen on the others' pairs) the average was preferred for 18 of 18 sources (docs/fitting.md).

The noise draws repeat the whole rule (`_drawn_laws`): draw k is `choose` on approach 2's draw k of the minima with
approach 3's draw k of E, the test included, so a draw may free E where the point estimate held it and the reverse.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from scipy import special

from transformer.scaling import allocation, backtest, batch_lm, interval

E_STARTS = (0.2, 0.5, 0.8, 0.95)  # E as fractions of the lowest minimum


FRONTIER_BUDGETS = 6  # the frontier is fitted to the minima of the largest this many budgets
E_TEST = 3.841  # χ² 95% quantile, 1 dof: approach 3's E is rejected when it raises the minima's RSS by more (× σ²)
E_UNIDENTIFIED = 1e-3  # a fitted E below this fraction of the lowest minimum: the minima do not pin E down
MISFIT_FLAG = 2.0  # the frontier misfits when its residual RMS exceeds this many times the minima's noise sd


def fit(flops_B: np.ndarray, loss_B: np.ndarray, e_fixed: float | None = None) -> dict[str, float] | None:
    """{"E", "k", "gamma", "rms_log_residual", "dof" (minima − fitted parameters)} or None with fewer than 3 budgets (2 with `e_fixed`) or a
    failed fit. `e_fixed`: E held at that value (only k and γ fitted)."""
    return fit_many(np.asarray(flops_B, float)[None], np.asarray(loss_B, float)[None], [e_fixed])[0]


def fit_many(flops_KB: np.ndarray, loss_KB: np.ndarray,
             e_fixed_K: Sequence[float | None] | None = None) -> list[dict[str, float] | None]:
    """`fit` of K sets of B minima at once (noise draws), (K, B) each: one Levenberg–Marquardt batch (`batch_lm`)
    over the K sets × the E_STARTS, within the bounds 0 ≤ γ ≤ 10, E < min L (E held where `e_fixed_K[k]`)."""
    flops_KB, loss_KB = np.atleast_2d(np.asarray(flops_KB, float)), np.atleast_2d(np.asarray(loss_KB, float))
    e_fixed_K = list(e_fixed_K) if e_fixed_K is not None else [None] * len(loss_KB)
    out: list[dict[str, float] | None] = [None] * len(loss_KB)
    ok_K = [loss_KB.shape[1] >= (2 if e else 3) and bool(np.all(np.isfinite(l) & (l > 0)))
            and (e is None or 0 < e < l.min()) for l, e in zip(loss_KB, e_fixed_K)]
    ks = np.flatnonzero(ok_K)
    if not len(ks):
        return out
    log_c_KB, log_l_KB = np.log(flops_KB[ks]), np.log(loss_KB[ks])
    centre_K = log_c_KB.mean(axis=1)  # k at the centre keeps the fit well scaled: k·C^-γ = exp(ln k_c − γ(ln C − centre))
    x_KB = log_c_KB - centre_K[:, None]
    min_K = loss_KB[ks].min(axis=1)
    upper_K = np.log(min_K) - 1e-9
    fixed_K = np.array([e_fixed_K[k] if e_fixed_K[k] is not None else np.nan for k in ks])
    starts, owner, lower, upper = [], [], [], []
    for n, fraction in enumerate(E_STARTS):
        sel = np.arange(len(ks)) if n == 0 else np.flatnonzero(np.isnan(fixed_K))  # E held: one start
        e0 = np.where(np.isnan(fixed_K), fraction * min_K, fixed_K)[sel]
        x, gap = x_KB[sel], np.log(np.maximum(loss_KB[ks][sel] - e0[:, None], 1e-12))
        xm = x - x.mean(axis=1, keepdims=True)
        slope = (xm * (gap - gap.mean(axis=1, keepdims=True))).sum(axis=1) / (xm**2).sum(axis=1)
        level = gap.mean(axis=1) - slope * x.mean(axis=1)
        held = ~np.isnan(fixed_K[sel])
        lo = np.stack([np.full(len(sel), -np.inf), np.zeros(len(sel)), np.where(held, np.log(e0), -np.inf)], 1)
        hi = np.stack([np.full(len(sel), np.inf), np.full(len(sel), 10.0), np.where(held, np.log(e0), upper_K[sel])], 1)
        x0 = np.stack([level, np.maximum(-slope, 1e-3), np.log(e0)], 1)
        starts.append(np.clip(x0, np.minimum(lo + 1e-9, hi), np.maximum(hi - 1e-9, lo)))
        owner.append(sel)
        lower.append(lo)
        upper.append(hi)
    owner_S = np.concatenate(owner)

    def residuals(p_S3: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x = x_KB[owner_S[idx]]
        term_SB = p_S3[:, :1] - p_S3[:, 1:2] * x
        total_SB = np.logaddexp(term_SB, p_S3[:, 2:3])
        w_SB = np.exp(term_SB - total_SB)  # d total / d term; 1 − w for ln E
        return total_SB - log_l_KB[owner_S[idx]], np.stack([w_SB, -w_SB * x, 1.0 - w_SB], axis=-1)

    p_S3, f_S = batch_lm.minimize(residuals, np.concatenate(starts), 1.0, delta=None,
                                  lower=np.concatenate(lower), upper=np.concatenate(upper))
    for i, k in enumerate(ks):
        mine = np.flatnonzero(owner_S == i)
        s = mine[int(np.argmin(f_S[mine]))]
        if not np.isfinite(f_S[s]):
            continue
        ln_kc, gamma, ln_e = p_S3[s]
        with np.errstate(over="ignore"):
            coef = float(np.exp(ln_kc + gamma * centre_K[i]))
        if np.isfinite(coef):
            out[k] = {"E": float(np.exp(ln_e)), "k": coef, "gamma": float(gamma),
                      "rms_log_residual": float(np.sqrt(2 * f_S[s] / log_l_KB.shape[1])),
                      "dof": log_l_KB.shape[1] - (2 if e_fixed_K[k] is not None else 3)}
    return out


def largest(flops_B: Sequence[float], loss_B: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """The FRONTIER_BUDGETS largest-compute minima, increasing in C: (flops, loss), each (≤ FRONTIER_BUDGETS,)."""
    order_B = np.argsort(np.asarray(flops_B, float), kind="stable")[-FRONTIER_BUDGETS:]
    return np.asarray(flops_B, float)[order_B], np.asarray(loss_B, float)[order_B]


def fit_largest(flops_B: Sequence[float], loss_B: Sequence[float], e_fixed: float | None = None) -> dict[str, float] | None:
    """`fit` through the largest FRONTIER_BUDGETS minima (see the module docstring)."""
    return fit(*largest(flops_B, loss_B), e_fixed=e_fixed)


MIXTURE_KEYS = ("weight_held", "E_held", "k_held", "gamma_held", "E_free", "k_free", "gamma_free")


def loss_at(law: dict[str, Any], flops: np.ndarray) -> np.ndarray:
    """L_opt(C) = E + k·C^(−γ); with "weight_held" (the soft test's mixture, `held_weight`) the weighted average
    w·(E_held + k_held·C^(−γ_held)) + (1 − w)·(E_free + k_free·C^(−γ_free)). The law's values are floats or arrays
    broadcasting against `flops` (draws (K, 1) against compute values (Q,))."""
    c = np.asarray(flops, float)
    if "weight_held" not in law:
        return law["E"] + law["k"] * np.power(c, -np.asarray(law["gamma"], float))
    w = np.asarray(law["weight_held"], float)
    held = law["E_held"] + law["k_held"] * np.power(c, -np.asarray(law["gamma_held"], float))
    free = law["E_free"] + law["k_free"] * np.power(c, -np.asarray(law["gamma_free"], float))
    return w * held + (1 - w) * free


def asymptote(law: dict[str, Any]) -> Any:
    """The loss the law tends to as C → ∞: E, or the mixture's w·E_held + (1 − w)·E_free."""
    if "weight_held" not in law:
        return law["E"]
    return law["weight_held"] * law["E_held"] + (1 - law["weight_held"]) * law["E_free"]


def held_weight(statistic: float) -> float:
    """The held law's weight in the soft test: 1 / (1 + exp((statistic − E_TEST) / 2)); ½ at the threshold, → 1
    as the minima fit the held E as well as a free one, → 0 as they reject it."""
    return float(special.expit((E_TEST - statistic) / 2.0))


def mixed(held: dict[str, float], free: dict[str, float], weight_held: float) -> dict[str, float]:
    """The MIXTURE_KEYS of the soft test's average of `held` and `free` (the same law twice: that law alone)."""
    return {"weight_held": float(weight_held), **{f"{k}_held": held[k] for k in ("E", "k", "gamma")},
            **{f"{k}_free": free[k] for k in ("E", "k", "gamma")}}


def draw_arrays(draws: dict[str, list] | None) -> dict[str, np.ndarray] | None:
    """Stored noise draws (fit.json's frontier "bootstrap" "draws") as arrays: E, k, gamma and, where stored, the
    soft test's MIXTURE_KEYS, (K,) each (NaN: a failed draw); None without draws."""
    keys = ("E", "k", "gamma") + (MIXTURE_KEYS if draws and "weight_held" in draws else ())
    return interval.read_draws(draws, keys)


def _largest_fits(problems: Sequence[tuple[np.ndarray, np.ndarray, float | None]]) -> list[dict[str, float] | None]:
    """`fit_largest` of each (flops_B, loss_B, e_fixed), batched: one `fit_many` per number of minima fitted."""
    pairs = [largest(f, l) for f, l, _ in problems]
    out: list[dict[str, float] | None] = [None] * len(problems)
    for size in {len(f) for f, _ in pairs}:
        idx = [i for i, (f, _) in enumerate(pairs) if len(f) == size]
        got = fit_many(np.array([pairs[i][0] for i in idx]), np.array([pairs[i][1] for i in idx]),
                       [problems[i][2] for i in idx])
        for i, law in zip(idx, got):
            out[i] = law
    return out


def choose_many(problems: Sequence[tuple[Sequence[float], Sequence[float], float | None]],
                noise_sd: float | None) -> list[tuple[dict[str, float] | None, dict[str, Any]]]:
    """`choose` of each (flops_B, loss_B, e3), all their fits in a few batches."""
    arrays = [(np.asarray(f, float), np.asarray(l, float), e) for f, l, e in problems]
    usable = [e is not None and 0 < e < l.min() for _, l, e in arrays]
    laws = _largest_fits([(f, l, None) for f, l, _ in arrays] + [(f, l, e) for (f, l, e), u in zip(arrays, usable) if u])
    free_K, held_iter = laws[:len(arrays)], iter(laws[len(arrays):])
    return [_decide(free, next(held_iter) if u else None, l, e, noise_sd)
            for free, u, (_, l, e) in zip(free_K, usable, arrays)]


def choose(flops_B: Sequence[float], loss_B: Sequence[float], e3: float | None,
           noise_sd: float | None) -> tuple[dict[str, float] | None, dict[str, Any]]:
    """The frontier through the largest FRONTIER_BUDGETS minima, E held at approach 3's `e3` unless the minima
    reject it (module docstring), with the record of the choice: {"E_from", "test"}. `noise_sd`: the sd of ln L_opt
    of one minimum (None: the free law's own residual sd stands in where it has residual degrees of freedom)."""
    return choose_many([(flops_B, loss_B, e3)], noise_sd)[0]


def _decide(free: dict[str, float] | None, held: dict[str, float] | None, loss_B: np.ndarray, e3: float | None,
            noise_sd: float | None) -> tuple[dict[str, float] | None, dict[str, Any]]:
    """`choose`'s test, given the free law and the one with E held at `e3` (None: not fitted)."""
    if held is None:
        note = "approach 3 gives no E below the lowest minimum to hold" if free else None
        if free is not None and free["E"] < E_UNIDENTIFIED * loss_B.min():
            note = ("the minima drive E to 0: a pure power law, which overstates the loss drop far beyond the grid "
                    "(approach 3 gives no E to hold)")
        return free, {"E_from": "the minima", "test": note}
    if free is None or free["E"] < E_UNIDENTIFIED * loss_B.min():
        return held, {"E_from": "approach 3", "test": "the minima alone do not identify E"}
    n = min(len(loss_B), FRONTIER_BUDGETS)
    rss_free, rss_held = free["rms_log_residual"] ** 2 * n, held["rms_log_residual"] ** 2 * n
    sd, sd_from = noise_sd, "the minima's noise draws"
    if not (sd and np.isfinite(sd) and sd > 0):
        sd, sd_from = interval.residual_sd(free["rms_log_residual"], free["dof"]), "the free law's residual sd"
    if sd is None:
        return held, {"E_from": "approach 3", "test": "no noise estimate and no residual degrees of freedom to "
                                                      "test approach 3's E against: held"}
    statistic = (rss_held - rss_free) / sd**2
    test = {"statistic": float(statistic), "threshold": E_TEST, "noise_sd": float(sd), "noise_sd_from": sd_from,
            "E_free": free["E"], "E_approach3": float(e3), "rss_free": float(rss_free), "rss_held": float(rss_held),
            "rule": "approach 3's E is held unless (RSS_held − RSS_free) / σ² > the χ²(1) 95% quantile; predictions "
                    "average the held and free laws with weights 1 / (1 + exp((statistic − threshold) / 2)) and the rest"}
    chosen, e_from = (held, "approach 3") if statistic <= E_TEST else (free, "the minima (they reject approach 3's E)")
    return {**chosen, **mixed(held, free, held_weight(statistic))}, {"E_from": e_from, "test": test}


def minima_noise(flops_B: Sequence[float], draws2: dict[str, np.ndarray] | None) -> float | None:
    """The minima's own noise: the median over the largest FRONTIER_BUDGETS budgets of the sd of ln L_opt over the
    noise draws (None without draws)."""
    if draws2 is None:
        return None
    _, kept = largest(flops_B, np.arange(len(flops_B)))
    return backtest.median_log_sd(np.asarray(draws2["loss_opt"])[kept.astype(int)])


def _drawn_laws(draws2: dict[str, np.ndarray], approach3: dict[str, Any],
                noise_sd: float | None) -> tuple[list[dict[str, float] | None], list[bool]]:
    """The frontier of each noise draw k, by `choose` itself: draw k's minima (`draws2`, (B, K)) and approach 3's
    draw k of E (its point E where that draw failed), the test repeated per draw. Returns the K laws (None: failed)
    and whether each held approach 3's E.

    Every draw repeats the whole rule, the choice between held and free E included: draws that all kept the point
    estimate's choice would leave out how often the data could have chosen otherwise, and on synthetic sweeps of a
    known law the compute multiplier's intervals then covered the truth at 94, 85, 89, 88% inside the grid (120 pairs,
    50 draws; with the choice repeated 92.5, 92.5, 91, 92%, and 97.5, 97.5, 95.8, 94.2% with the percentile ranks
    of `interval.PERCENTILE_METHOD`, docs/limitations.md)."""
    samples = draws2["a"].size
    e_K = interval.draws_or_point(approach3, ("E",), samples)["E"] if approach3.get("E") is not None else \
        [None] * samples
    chosen = choose_many([(draws2["C_opt"][:, k], draws2["loss_opt"][:, k], e) for k, e in enumerate(e_K)], noise_sd)
    return [law for law, _ in chosen], [choice["E_from"] == "approach 3" for _, choice in chosen]


def fit_frontier(approach2: dict[str, Any], draws2: dict[str, np.ndarray] | None, approach3: dict[str, Any],
                 source: str, e3_refits: dict[float, float | None] | None = None) -> dict[str, Any]:
    """L_opt(C) = E + k·C^-γ through the largest FRONTIER_BUDGETS of approach 2's minima, E from `choose`:
    fit.json's "frontier" (the law, where E came from and the test, the backtest, the intervals of E and γ over the
    noise draws `draws2` of approach 2 with their `source`, a misfit warning, the "interval" terms that every
    prediction shares: span, largest_flops, the spread q and where it came from), plus "_draws" for `predictions`.
    Each noise draw is chosen by the same rule (`_drawn_laws`); "bootstrap" counts the draws that held E ("E_held").

    The backtest refits each origin (the first k minima) by the same rule, with approach 3's E refitted on the
    points of those budgets alone: `e3_refits` maps the C_opt of an origin's largest minimum to that E (None: no
    refits; the backtest then holds approach 3's E from all the points, which has seen the later budgets)."""
    budgets = approach2.get("budgets", [])
    flops_B, loss_B = [b["C_opt"] for b in budgets], [b["loss_opt"] for b in budgets]
    noise_sd = minima_noise(flops_B, draws2)
    e3 = approach3.get("E")
    law, choice = choose(flops_B, loss_B, e3, noise_sd) if len(budgets) >= 2 else (None, {"E_from": "the minima"})
    out: dict[str, Any] = {"form": f"L_opt(C) = E + k·C^-gamma through the largest {FRONTIER_BUDGETS} "
                                   "of approach 2's minima", **choice, "law": law, "minima_noise_sd": noise_sd}
    if law is None:
        out["note"] = f"{len(budgets)} budget minima; the frontier needs at least 3 (2 with approach 3's E)"
        return out
    order_B = np.argsort(flops_B, kind="stable")
    f_B, l_B = np.asarray(flops_B, float)[order_B], np.asarray(loss_B, float)[order_B]
    origins = range(backtest.MIN_BUDGETS, len(f_B))
    refit_e = (lambda c: e3_refits.get(float(c))) if e3_refits is not None else (lambda c: e3)
    refit = dict(zip(origins, choose_many([(f_B[:k], l_B[:k], refit_e(f_B[k - 1])) for k in origins], noise_sd)))
    bt = backtest.pairs(flops_B, loss_B, lambda f, l: refit[len(f)][0], loss_at)
    min_origin = max(backtest.MIN_BUDGETS, min(FRONTIER_BUDGETS, len(flops_B) - 1))
    out["backtest"] = backtest.summary(bt, min_origin)
    out["backtest"]["approach3_E"] = "refitted per origin" if e3_refits is not None else "from all the points"
    out["interval"] = {"form": f"L̂·exp(±max(1.96·σ_noise, q·x·γ^{backtest.GAMMA_POWER:g}/span^{backtest.SPAN_POWER:g})),"
                               " x = ln(C / largest_flops), γ the law's exponent (at least gamma_floor)",
                       "largest_flops": float(max(flops_B)), "span": float(np.log(max(flops_B) / min(flops_B))),
                       "span_power": backtest.SPAN_POWER, "gamma": backtest.lever_gamma(law["gamma"]),
                       "gamma_power": backtest.GAMMA_POWER, "gamma_floor": backtest.GAMMA_FLOOR,
                       "noise_at": backtest.NOISE_AT,
                       "spread": backtest.FRONTIER_SPREAD, "spread_from": backtest.SPREAD_FROM}
    if draws2 is not None:
        fits_K, held_K = _drawn_laws(draws2, approach3, noise_sd)
        full_K = [None if f is None else f if "weight_held" in f else {**f, **mixed(f, f, 1.0)} for f in fits_K]
        draws = {key: np.array([np.nan if f is None else f[key] for f in full_K])
                 for key in ("E", "k", "gamma") + MIXTURE_KEYS}
        out.update(interval.of_draws(draws, ("E", "gamma"), source))
        out["bootstrap"] = {"samples": int(draws2["a"].size), "failed": int(np.isnan(draws["E"]).sum()),
                            "E_held": int(sum(held_K)), "draws": interval.draw_lists(draws)}
        out["_draws"] = {**draws, **allocation.law_draws(draws2, approach3)}
        if noise_sd and law["rms_log_residual"] > MISFIT_FLAG * noise_sd:
            out["warning"] = (f"the frontier's log residual RMS {law['rms_log_residual']:.4f} is "
                              f"{law['rms_log_residual'] / noise_sd:.1f}x the minima's noise sd {noise_sd:.4f}: "
                              "E + k·C^-γ does not describe these minima to their noise; trust the predictions "
                              "only as far as the calibrated interval says")
    return out


def predictions(
    flops_Q: Sequence[float], allocation_law: dict[str, Any] | None, law: dict[str, float] | None,
    draws: dict[str, np.ndarray] | None, calibration: dict[str, Any] | None, source: str,
    allocation_terms: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One object per budget asked for: flops, params (N_opt), tokens (D_opt) from `allocation_law`
    (`allocation.law`; None: approach 2 has no power law), loss (L_opt) from the frontier `law`, and their 95%
    intervals (`interval.Interval.fields`; `draws`: the allocation's a, b, N_coef, D_coef and the frontier's E, k,
    gamma (and mixture), each (K,), from the loss noise `source`). The loss interval is `backtest.frontier_interval`'s: the noise draws' spread at C,
    or beyond the largest fitted budget at that budget (without draws, the frontier's own log residual RMS where it
    has residual degrees of freedom: "fit_residuals"), and the
    extrapolation term, which grows with the distance beyond the largest fitted budget in units of the compute range
    of the minima and with the law's γ (`calibration`: the frontier's "interval", {"largest_flops", "span", "gamma",
    "spread"}); the noise-only
    one is `loss_noise_ci95`, the terms `loss_interval`. The params and tokens intervals are
    `allocation.interval_at`'s (`allocation_terms`: `allocation.shared_terms`; None: none), their terms
    `params_interval`, `tokens_interval`."""
    out = []
    for c in flops_Q:
        pred: dict[str, Any] = {"flops": float(c)}
        if allocation_law is not None:
            pred["params"] = float(allocation_law["N_coef"] * c ** allocation_law["a"])
            pred["tokens"] = float(allocation_law["D_coef"] * c ** allocation_law["b"])
        pred["loss"] = float(loss_at(law, c)) if law else None
        if allocation_law is None or not law:
            pred["note"] = ("approach 2 has no power law; " if allocation_law is None else "") + \
                ("no frontier (fewer than 3 budget minima)" if not law else "")
        if allocation_law is not None and allocation_terms is not None:
            for key, _, coef, exponent in allocation.QUANTITIES:
                with np.errstate(over="ignore", invalid="ignore"):
                    noise_sd = backtest.log_sd(draws[coef] * c ** draws[exponent]) if draws is not None else None
                ci, pred[f"{key}_interval"] = allocation.interval_at(pred[key], c, noise_sd, source,
                                                                     allocation_terms, key)
                pred.update(ci.fields(key))
        loss_K, noise_ci = None, None
        if draws is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                if law:
                    loss_K = loss_at(draws, c)
                    loss_K = loss_K[loss_K > 0]
                    noise_ci = interval.from_draws(loss_K, source)
                    pred.update(noise_ci.fields("loss_noise") if noise_ci else {"loss_noise_ci95": None})
        if law and calibration is not None:
            edge = min(float(c), float(calibration["largest_flops"]))  # beyond the data: the noise where they end
            if loss_K is not None:
                with np.errstate(over="ignore", invalid="ignore"):
                    noise_sd, noise_source = backtest.log_sd(loss_K if edge == c else loss_at(draws, edge)), source
            else:
                noise_sd, noise_source = (interval.residual_sd(law.get("rms_log_residual"), law.get("dof", 0)),
                                          "fit_residuals")
            ci, pred["loss_interval"] = backtest.frontier_interval(
                pred["loss"], float(np.log(c / calibration["largest_flops"])), calibration["span"], noise_sd,
                noise_source, calibration["spread"], noise_flops=edge, gamma=calibration.get("gamma"))
            pred.update(ci.fields("loss"))
        elif law:
            pred.update((noise_ci or interval.none("no noise draws and no backtest calibration")).fields("loss"))
        out.append(pred)
    return out


def with_predictions(approach2: dict[str, Any], draws2: dict[str, np.ndarray] | None, approach3: dict[str, Any],
                     predict_flops: Sequence[float], source: str,
                     e3_refits: dict[float, float | None] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The one prediction route (`fits.fit_all`, `predict.frontier_predictions`): the frontier (`fit_frontier`,
    as fit.json stores it) and the predictions at `predict_flops` (`predictions`)."""
    front = fit_frontier(approach2, draws2, approach3, source, e3_refits)
    draws = front.pop("_draws", None)
    if draws is None and draws2 is not None:  # no frontier, but the allocation's draws (its interval's noise term)
        draws = allocation.law_draws(draws2, approach3)
    alloc_law = allocation.law(approach2, approach3)
    if alloc_law is not None:
        front["allocation"] = alloc_law
    alloc = allocation.shared_terms(approach2, draws2)
    if alloc is not None:
        front["allocation_interval"] = alloc
    preds = predictions(predict_flops, alloc_law, front.get("law"), draws, front.get("interval"), source,
                        alloc) if predict_flops else []
    return front, preds
