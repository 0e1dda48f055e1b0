"""The loss frontier L_opt(C) = E + k·C^(−γ) through the per-budget minima, and predictions at any C.

Legend: B = budgets, K = noise draws, Q = budgets asked for.

The irreducible term E stays in the model: a pure power law through the minima bends the wrong way and
misses the loss at 4× the largest budget by 2–3% (docs, scaling-design notes). The fit is least squares
in ln L (ln L = logaddexp(ln k − γ ln C, ln E)) with 0 < E < min L_opt and γ ≥ 0, from a few starts.

Which minima set E: the largest FRONTIER_BUDGETS (`fit_largest`). Fitted through every minimum, the smallest
budgets (where the loss still falls steeply and the form bends most) pull E up, and the frontier over-predicts
far out: on the published IsoFLOP sets (docs/fitting.md) the largest six give a median |error| of 0.16% at 2×
and 0.40% at 4× the largest fitted budget, against 0.76% and 1.85% through every minimum (weighting the
largest budgets, or a pure power law through the last three, fall between).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from transformer.scaling import backtest, batch_lm, interval

E_STARTS = (0.2, 0.5, 0.8, 0.95)  # E as fractions of the lowest minimum


FRONTIER_BUDGETS = 6  # the frontier is fitted to the minima of the largest this many budgets
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


def fit_largest_many(flops_BK: np.ndarray, loss_BK: np.ndarray,
                     e_fixed_K: Sequence[float | None]) -> list[dict[str, float] | None]:
    """`fit_largest` of K noise draws of the minima at once, (B, K) each (`fit_many`)."""
    pairs = [largest(flops_BK[:, k], loss_BK[:, k]) for k in range(flops_BK.shape[1])]
    return fit_many(np.array([f for f, _ in pairs]), np.array([l for _, l in pairs]), e_fixed_K)


def loss_at(law: dict[str, float], flops: np.ndarray) -> np.ndarray:
    """L_opt(C) = E + k·C^(−γ)."""
    return law["E"] + law["k"] * np.power(np.asarray(flops, float), -law["gamma"])


def e_unpinned(approach2: dict[str, Any]) -> bool:
    """Whether approach 2's minima leave E unidentified (the frontier through them drives E to ~0, or there is
    none): then the frontier holds E at approach 3's, which must be fitted first."""
    budgets = approach2.get("budgets", [])
    if not budgets:
        return False
    loss_B = [b["loss_opt"] for b in budgets]
    law = fit_largest([b["C_opt"] for b in budgets], loss_B)
    return law is None or law["E"] < E_UNIDENTIFIED * min(loss_B)


def fit_frontier(approach2: dict[str, Any], draws2: dict[str, np.ndarray] | None, approach3: dict[str, Any],
                 source: str) -> dict[str, Any]:
    """L_opt(C) = E + k·C^-γ through the largest FRONTIER_BUDGETS of approach 2's minima: fit.json's "frontier"
    (the law, where E came from, the backtest, the intervals of E and γ over the noise draws `draws2` of
    approach 2 with their `source`, a misfit warning), plus "_draws" and "_calibration" for `predictions`.

    When the minima do not pin E down (`e_unpinned`) E is held at approach 3's (its draws too, where there are
    any), and the frontier says so; the backtest's refits hold it there as well."""
    budgets = approach2.get("budgets", [])
    flops_B, loss_B = [b["C_opt"] for b in budgets], [b["loss_opt"] for b in budgets]
    law = fit_largest(flops_B, loss_B)
    out: dict[str, Any] = {"form": f"L_opt(C) = E + k·C^-gamma through the largest {FRONTIER_BUDGETS} "
                                   "of approach 2's minima", "E_from": "the minima"}
    e_draws, e_held = None, None
    if e_unpinned(approach2):
        if approach3.get("E") and approach3["E"] < min(loss_B):
            e_held = approach3["E"]
            law = fit_largest(flops_B, loss_B, e_fixed=e_held)
            out["E_from"] = "approach 3 (the minima alone do not identify E)"
            e_draws = approach3.get("bootstrap", {}).get("draws", {}).get("E")
        elif law is not None:
            out["E_from"] = "the minima, which drive it to 0: a pure power law, which overstates the loss drop " \
                            "far beyond the grid (approach 3 gives no E to hold)"
    out["law"] = law
    if law is None:
        out["note"] = f"{len(budgets)} budget minima; the frontier needs at least 3"
        return out
    bt = backtest.pairs(flops_B, loss_B, lambda f, l: fit_largest(
        f, l, e_fixed=e_held if e_held is not None and e_held < min(l) else None), loss_at)
    min_origin = max(backtest.MIN_BUDGETS, min(FRONTIER_BUDGETS, len(flops_B) - 1))
    out["backtest"] = backtest.summary(bt, min_origin)
    out["_calibration"] = {"largest_flops": float(max(flops_B)), "scale": backtest.misfit_scale(bt, min_origin)}
    if draws2 is not None:
        e_K = [None if out["E_from"].startswith("the minima") else (
            e_draws[k] if e_draws and e_draws[k] is not None and np.isfinite(e_draws[k]) else law["E"])
            for k in range(draws2["a"].size)]
        fits_K = fit_largest_many(draws2["C_opt"], draws2["loss_opt"], e_K)
        nan = {"E": np.nan, "k": np.nan, "gamma": np.nan}
        draws = {key: np.array([(f or nan)[key] for f in fits_K]) for key in ("E", "k", "gamma")}
        out.update(interval.of_draws(draws, ("E", "gamma"), source))
        out["bootstrap"] = {"samples": int(draws2["a"].size), "failed": int(np.isnan(draws["E"]).sum()),
                            "draws": interval.draw_lists(draws)}
        out["_draws"] = {**draws, **{k: draws2[k] for k in ("a", "b", "N_coef", "D_coef")}}
        # The minima's own noise: the sd of ln L_opt over the draws, per budget fitted.
        _, kept_loss = largest(flops_B, np.arange(len(flops_B)))
        noise_B = [v for i in kept_loss if (v := backtest.log_sd(draws2["loss_opt"][int(i)])) is not None]
        noise_sd = float(np.median(noise_B)) if noise_B else None
        out["minima_noise_sd"] = noise_sd
        if noise_sd and law["rms_log_residual"] > MISFIT_FLAG * noise_sd:
            out["warning"] = (f"the frontier's log residual RMS {law['rms_log_residual']:.4f} is "
                              f"{law['rms_log_residual'] / noise_sd:.1f}x the minima's noise sd {noise_sd:.4f}: "
                              "E + k·C^-γ does not describe these minima to their noise; trust the predictions "
                              "only as far as the backtest's calibrated interval says")
    return out


def predictions(
    flops_Q: Sequence[float], approach2: dict[str, Any], law: dict[str, float] | None,
    draws: dict[str, np.ndarray] | None, calibration: dict[str, Any] | None, source: str,
) -> list[dict[str, Any]]:
    """One object per budget asked for: flops, params (N_opt), tokens (D_opt), loss (L_opt) and their
    95% intervals (`interval.Interval.fields`; `draws`: a, b, N_coef, D_coef and E, k, gamma, each (K,), from
    the loss noise `source`). The loss interval is `backtest.interval`'s: the noise draws' spread (without draws,
    the frontier's own log residual RMS where it has residual degrees of freedom: "fit_residuals") widened by the
    backtest's misfit at the distance beyond the largest fitted budget (`calibration`: {"largest_flops",
    "scale"}); the noise-only one is `loss_noise_ci95`, the terms `loss_interval`."""
    out = []
    for c in flops_Q:
        pred: dict[str, Any] = {"flops": float(c)}
        if approach2.get("a") is not None:
            pred["params"] = float(approach2["N_coef"] * c ** approach2["a"])
            pred["tokens"] = float(approach2["D_coef"] * c ** approach2["b"])
        pred["loss"] = float(loss_at(law, c)) if law else None
        if approach2.get("a") is None or not law:
            pred["note"] = ("approach 2 has no power law; " if approach2.get("a") is None else "") + \
                ("no frontier (fewer than 3 budget minima)" if not law else "")
        loss_K, noise_ci = None, None
        if draws is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                for key, values in (("params", draws["N_coef"] * c ** draws["a"]),
                                    ("tokens", draws["D_coef"] * c ** draws["b"])):
                    ci = interval.from_draws(values, source)
                    pred.update(ci.fields(key) if ci else {f"{key}_ci95": None})
                if law:
                    loss_K = draws["E"] + draws["k"] * c ** -draws["gamma"]
                    loss_K = loss_K[loss_K > 0]
                    noise_ci = interval.from_draws(loss_K, source)
                    pred.update(noise_ci.fields("loss_noise") if noise_ci else {"loss_noise_ci95": None})
        if law and calibration is not None:
            noise_sd, noise_source = (backtest.log_sd(loss_K), source) if loss_K is not None else (
                interval.residual_sd(law.get("rms_log_residual"), law.get("dof", 0)), "fit_residuals")
            ci, pred["loss_interval"] = backtest.interval(pred["loss"], float(np.log(c / calibration["largest_flops"])),
                                                          noise_sd, calibration["scale"], noise_source)
            pred.update(ci.fields("loss"))
        elif law:
            pred.update((noise_ci or interval.none("no noise draws and no backtest calibration")).fields("loss"))
        out.append(pred)
    return out


def with_predictions(approach2: dict[str, Any], draws2: dict[str, np.ndarray] | None, approach3: dict[str, Any],
                     predict_flops: Sequence[float], source: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The one prediction route (`fits.fit_all`, `predict.frontier_predictions`): the frontier (`fit_frontier`,
    as fit.json stores it) and the predictions at `predict_flops` (`predictions`)."""
    front = fit_frontier(approach2, draws2, approach3, source)
    draws, calibration = front.pop("_draws", None), front.pop("_calibration", None)
    preds = predictions(predict_flops, approach2, front.get("law"), draws, calibration, source) if predict_flops else []
    return front, preds
